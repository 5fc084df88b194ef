"""The dynamic-batching queue between the HTTP handlers and one model's Translator.

Handlers submit Jobs (a request's texts) from the event loop and await their futures; one
worker thread per model does the rest: it turns texts into ids, takes the oldest job's
kind of work (jobs of one kind share a search and differ only in their sentences),
gathers pending sentences of that kind round-robin over the jobs (so a long request
cannot hold back a short one) until the batch is full, decodes them in one Translator
call, and turns the hypotheses into each job's answer (`Job.finish`). Meanwhile the event
loop goes on accepting requests: torch releases the GIL in its kernels. (Tokenizing is the
worker's too: SentencePiece releases the GIL, and taking it back from a busy worker costs
the event loop about a millisecond per call.)

When to decode: at once when a batch is full; otherwise the worker waits for more only
while more are expected, i.e. until as many sentences are waiting as were in the server
at once during the last second, while they keep coming (no pause over `wait_gap`), and
never longer than `max_wait` after it became free. So a lone client never waits, and
clients that send again as soon as they are answered fill batches as offline translation
does.

Work nobody waits for is dropped: a job whose future is done (its request gave up: the
client left, or the server is stopping) or whose deadline passed leaves the queue before
decoding, and its sentences leave a running batch at the next decoding step
(Translator.translate_ids' `cancelled`). A job with a deadline is admitted only when the
queued work can be done before the deadlines waiting (admission.py), else submit raises
Overloaded.

A translation never depends on the other sentences of its batch (Translator's invariant,
constrained or not: a sentence's constraints are its own, so jobs with and without them
share batches; so is a multilingual model's target language, its tag per sentence, so jobs
into different languages share batches too), and only jobs with the same search (nbest
aside, which only cuts the finished list) share a batch, so batching across clients
changes only the speed.
Sampling jobs are never merged: each is decoded alone, in one Translator call with its
search's options, which starts a random stream of its own from its seed; so an answer
never depends on the other requests.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.generation.constraints import TokenConstraints
from nmt.generation.terminology import Glossary, TextConstraints
from nmt.generation.translator import Translator
from nmt.serving.admission import Backlog, WorkEstimate, retry_after, units

log = logging.getLogger("nmt.serving")

TRANSLATE, SCORE = "translate", "score"
LOAD_WINDOW = 1.0  # seconds over which the peak of sentences in the server is remembered


class QueueFull(Exception):
    """The model's queue holds max_queue sentences already."""


class Closed(Exception):
    """The queue no longer takes work (the server is stopping)."""


class Expired(Exception):
    """The job's deadline passed before it was decoded (its request timed out)."""


class Invalid(NmtError):
    """A request's input the model cannot take (a constraint it cannot spell): a 400."""


class Overloaded(Exception):
    """With a job queued, the queued work would not be done before the earliest
    deadline waiting (admission.py)."""

    def __init__(self, message: str, seconds: float, retry_after: int):
        super().__init__(message)
        self.seconds = seconds  # the estimated time to do the queued work and the job's
        self.retry_after = retry_after  # seconds after which it would fit


@dataclass(eq=False)
class Job:
    """One request's work for the worker: translate `texts`, or score `targets` given them.

    The future's result is `finish(job)` (run by the worker once every sentence is
    decoded; `job.results` then holds one result per text), or `job.results` itself.
    """

    translator: Translator  # the model
    texts: Sequence[str]  # one sentence each
    # the request's search (None: the translator's): TRANSLATE keeps its nbest hypotheses
    # per text, SCORE normalizes by its lenpen
    search: SearchConfig | None = None
    op: str = TRANSLATE  # TRANSLATE: hypotheses per text; SCORE: forced decoding
    prefixes: Sequence[str | None] | None = None  # TRANSLATE: target text to force
    # TRANSLATE: per text, phrases to include/exclude (None: none); the request's glossary
    # over the model's: the target terms of the terms a text holds are includes of it
    constraints: Sequence[TextConstraints | None] | None = None
    glossary: Glossary | None = None
    model_glossary: Glossary | None = None
    targets: Sequence[str] | None = None  # SCORE: the translations to score
    alignment: bool = False  # TRANSLATE: hypotheses carry attention
    # a multilingual model's languages (Translator's src_lang, tgt_lang: one, or one per
    # text), checked by the route already (None: a single-pair model's)
    src_lang: str | None = None
    tgt_lang: str | Sequence[str] | None = None
    kind: Hashable = None  # jobs of the same kind may share a batch (None: job_kind's)
    where: str = "texts"  # names the texts in messages (over-long lines)
    finish: Callable[[Job], Any] | None = None
    future: Future = field(default_factory=Future)
    # the worker's:
    sources: list[np.ndarray] = field(default_factory=list)  # ids ending in EOS
    prefix_ids: list[np.ndarray | None] | None = None
    constraint_ids: list[TokenConstraints | None] | None = None  # with constraints or glossary
    target_ids: list[np.ndarray] | None = None
    tgt_langs: list[str] | None = None  # tgt_lang per text
    tag_lengths: tuple[int, int] = (0, 0)  # positions its tags add to a source, a target
    warnings: list[str] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    taken: int = 0  # sentences handed to a batch so far
    left: int = 0  # sentences not decoded yet
    arrived: float = 0.0
    # time.monotonic() after which nobody waits for the answer (None: no deadline)
    deadline: float | None = None
    work: float = 0.0  # decoding work of all its sentences (admission.units)

    def __post_init__(self) -> None:
        if self.search is None:
            self.search = self.translator.search
        if self.kind is None:
            self.kind = job_kind(self.op, self.search, self.alignment)
        self.work = units(self.texts, 1 if self.op == SCORE else self.search.beam)

    def given_up(self, now: float) -> bool:
        """Nobody waits for this job any more: answered or cancelled, or past its deadline."""
        return self.future.done() or (self.deadline is not None and now > self.deadline)

    @property
    def nbest(self) -> int:
        """TRANSLATE: hypotheses kept per text."""
        assert self.search is not None
        return self.search.nbest

    @property
    def merge(self) -> bool:
        """False: decoded alone, in one call (sampling)."""
        assert self.search is not None
        return self.op == SCORE or not self.search.sampling

    def prepare(self) -> None:
        """Texts to ids, as the Translator makes them (NmtError for a line refused)."""
        translator = self.translator
        encoder = translator.source_encoder(self.where, warn=self.warnings.append)
        self.sources = _fit(encoder, self.texts)
        if self.prefixes is not None:
            encoded = [translator.encode_prefix(p) for p in self.prefixes]
            self.prefix_ids = [None if p is None else np.asarray(p, np.int64) for p in encoded]
        glossary = Glossary.merged(self.glossary, self.model_glossary)  # (in the worker)
        if self.constraints is not None or glossary is not None:
            self.constraint_ids = self._constraint_ids(glossary)
        if self.targets is not None:
            target = translator.target_encoder("targets", warn=self.warnings.append)
            self.target_ids = _fit(target, self.targets)
        if self.tgt_lang is not None:
            n = len(self.texts)
            self.tgt_langs = (
                [self.tgt_lang] * n if isinstance(self.tgt_lang, str) else list(self.tgt_lang)
            )
            self.tag_lengths = _tag_lengths(translator, self.src_lang, self.tgt_langs)
        self.results = [None] * len(self.texts)
        self.left = len(self.texts)

    def _constraint_ids(self, glossary: Glossary | None) -> list[TokenConstraints | None]:
        """Each text's constraints as target ids, its glossary terms included
        (Translator.constraint_ids); Invalid naming the text's constraints (or the text's
        line, for its glossary terms) when the model cannot take them."""
        assert self.search is not None
        wanted = self.constraints or [None] * len(self.texts)
        out = []
        for i, (constraints, text) in enumerate(zip(wanted, self.texts)):
            where = f"{self.where}:{i + 1}" if constraints is None else f"constraints[{i}]"
            try:
                out.append(self.translator.constraint_ids(constraints, text, glossary))
            except NmtError as exc:
                raise Invalid(f"{where}: {exc}") from None
            if out[-1] and self.search.sampling:  # the Translator's rule, as a 400 now
                raise Invalid(
                    f"{where}: constraints (a glossary's terms too) need beam search; "
                    "send sampling=false"
                )
        return out

    def unmet(self) -> list[str]:
        """Warnings naming the texts whose best translation lacks an include phrase (it
        did not fit the length limit, or the text is empty)."""
        assert self.constraint_ids is not None
        notes = []
        for i, (hyps, wanted) in enumerate(zip(self.results, self.constraint_ids)):
            if hyps and not hyps[0].constraints_met:
                notes.append(
                    f"{self.where}:{i + 1}: an include phrase could not be met within the "
                    "length limit; its translation is the best one that ended without it"
                )
            elif not hyps and wanted is not None and wanted.include:
                notes.append(
                    f"{self.where}:{i + 1}: an empty text, so its include phrases could not be met"
                )
        return notes

    def cost(self, i: int) -> int:
        """Sentence i's length as batching counts it, its tags included, as the
        Translator's batches count it (0: nothing to decode)."""
        n = len(self.sources[i])
        source_tags, target_tags = self.tag_lengths
        if self.target_ids is not None:  # an empty side is scored as [EOS]
            return max(max(n, 1) + source_tags, len(self.target_ids[i]) + target_tags)
        return n + source_tags if n else 0


def _tag_lengths(
    translator: Translator, src_lang: str | None, tgt_langs: list[str]
) -> tuple[int, int]:
    """The positions a multilingual model's tags add to a source and to a target (the
    same for every language of a model)."""
    tags = translator.languages
    if tags is None or not tgt_langs:
        return 0, 0
    return len(tags.source_prefix(src_lang, tgt_langs[0])), len(tags.target_prefix(tgt_langs[0]))


def job_kind(op: str, search: SearchConfig, alignment: bool = False) -> Hashable:
    """What jobs must share to share a batch: a translation's search (nbest aside: it
    only cuts the finished list) and whether attention is kept; a score's lenpen."""
    if op == SCORE:
        return (SCORE, search.lenpen)
    return (TRANSLATE, dataclasses.astuple(dataclasses.replace(search, nbest=1)), alignment)


class BatchQueue:
    """Queue and worker thread of one model (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        max_sentences: int,
        max_tokens: int = 0,
        max_wait: float = 0.1,
        wait_gap: float = 0.01,
        max_queue: int = 4096,
        on_batch: Callable[[int, float], None] | None = None,
        on_drop: Callable[[int], None] | None = None,
        device: torch.device | None = None,
    ):
        """`max_sentences`/`max_tokens` (padded source tokens, 0 = no limit) bound a batch
        as the Translator's own batching does, so a batch is one decoder call; `max_wait`
        and `wait_gap` in seconds; `on_batch(sentences, seconds)` is told of every batch
        decoded (empty lines, which need no decoding, not counted), `on_drop(sentences)`
        of sentences dropped because their job was given up (from the queue, or from a
        batch mid-way). `device`: the model's, made the worker thread's current CUDA
        device (a per-thread setting)."""
        self.name = name
        self.max_sentences, self.max_tokens = max_sentences, max_tokens
        self.max_wait, self.wait_gap, self.max_queue = max_wait, wait_gap, max_queue
        self.on_batch, self.on_drop = on_batch, on_drop
        self.estimate = WorkEstimate()
        self._backlog = Backlog()  # the work queued and its earliest deadline (admission)
        self._pending: set[Job] = set()  # submitted, not answered yet
        self._running_work = 0.0  # units of the batch being decoded
        self._batch_start = 0.0
        self._abort = False  # close(cancel=True): drop everything at the next step
        # jobs cancelled so far: a running batch looks at its jobs when this changes
        self.cancellations = 0
        self._cond = threading.Condition()
        self._inbox: list[Job] = []  # submitted, not seen by the worker yet
        self._waiting = 0  # sentences submitted and not in a batch yet
        self._running = 0  # sentences being decoded
        self._peak = [0, 0]  # most sentences in the server at once: this window, the last
        self._window_start = time.monotonic()
        self._free_since = time.monotonic()
        self._last_arrival = 0.0
        self._closed = False
        self._device = device
        self._thread = threading.Thread(target=self._work, name=f"nmt-serve-{name}", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Sentences waiting for a batch."""
        return self._waiting

    def submit(self, job: Job) -> Future:
        """Queue a job. Raises QueueFull, Overloaded (it could not finish before its
        deadline) or Closed instead of queueing."""
        n = len(job.texts)
        with self._cond:
            if self._closed:
                raise Closed(f"model {self.name} is stopping")
            if self._waiting and self._waiting + n > self.max_queue:
                raise QueueFull(f"model {self.name} has {self._waiting} sentences waiting")
            now = time.monotonic()
            self._admit(job, now)
            job.arrived = self._last_arrival = now
            self._pending.add(job)
            self._backlog.add(job)
            job.future.add_done_callback(functools.partial(self._done, job))
            self._inbox.append(job)
            self._waiting += n
            self._note_load(job.arrived)
            self._cond.notify()
        return job.future

    def _admit(self, job: Job, now: float) -> None:
        """Raise Overloaded when the work queued, `job`'s included, would not be done
        before the earliest deadline of the jobs waiting (admission.py)."""
        running_for = now - self._batch_start
        late = self.estimate.late(job, self._backlog, now, self._running_work, running_for)
        if late is None:
            return
        seconds, earliest = late
        if now + seconds > earliest:
            raise Overloaded(
                f"model {self.name}: about {seconds:.1f} s of decoding would be queued with "
                f"this request, more than the {max(0.0, earliest - now):.1f} s left to the "
                "requests waiting",
                seconds,
                retry_after(now + seconds - earliest),
            )

    def _done(self, job: Job, future: Future) -> None:
        """A job's future is settled (answered, failed or cancelled): its work leaves the
        backlog at once, so the next request is admitted against what is really left."""
        with self._cond:
            self._pending.discard(job)
            self._backlog.left(job, 0)
            if future.cancelled():
                self.cancellations += 1

    @property
    def alive(self) -> bool:
        """The worker thread still runs (it may be inside torch)."""
        return self._thread.is_alive()

    def close(self, timeout: float | None = None, cancel: bool = False) -> bool:
        """Stop the worker, waiting up to `timeout` for it; True once it has stopped.
        Without `cancel`, what is queued is decoded first; with it, every job not
        finished fails with Closed and a running batch stops at its next step."""
        with self._cond:
            self._closed = True
            if cancel:
                self._abort = True
                for job in list(self._pending):  # settling one removes it (_done)
                    _settle(job, exc=Closed(f"model {self.name} is stopping"))
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the worker ---------------------------------------------------------------------

    def _work(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        jobs: deque[Job] = deque()  # prepared, with sentences not in a batch yet
        while True:
            new = self._collect(block=not jobs)
            if new is None:
                return
            jobs = self._add(jobs, new)
            if not jobs:
                continue
            wait = self._wait_for_more(jobs, time.monotonic())
            if wait > 0:
                self._sleep(wait)
                continue
            jobs = self._add(jobs, self._collect(block=False) or [])  # those that just came
            if not jobs:
                continue
            batch = self._take(jobs)
            work = sum(job.work / len(job.texts) for job, i in batch if job.cost(i))
            with self._cond:
                self._waiting -= len(batch)
                self._running = len(batch)
                for job in {id(j): j for j, _ in batch}.values():
                    self._backlog.left(job, len(job.texts) - job.taken)
                self._running_work = work
                self._batch_start = time.monotonic()
            start = time.perf_counter()
            cancelled = _Cancelled(batch, self)
            try:
                outcome: list[Any] | Exception = _run(batch[0][0], batch, cancelled)
            except Exception as exc:  # noqa: BLE001 - the requests report it; the worker goes on
                log.exception("model %s: decoding a batch of %d failed", self.name, len(batch))
                outcome = exc
            seconds = time.perf_counter() - start
            with self._cond:  # before the answers go out, so new requests see the load right
                self._running, self._running_work = 0, 0.0
                self._free_since = time.monotonic()
            dropped = cancelled()
            _deliver(batch, outcome)
            for job in cancelled.jobs():
                self._fail_given_up(job)
            if dropped:
                self._dropped(len(dropped))
            elif batch[0][0].op != SCORE and not isinstance(outcome, Exception):
                self.estimate.measured(work, seconds)
            if self.on_batch is not None:  # the sentences decoded (not empty, not dropped)
                gone = set(dropped)
                decoded = sum(
                    1 for k, (job, i) in enumerate(batch) if job.cost(i) and k not in gone
                )
                self.on_batch(decoded, seconds)

    def _collect(self, block: bool) -> list[Job] | None:
        """The jobs submitted since the last look; with `block`, wait for one. None once
        closed with nothing left."""
        with self._cond:
            while block and not self._inbox and not self._closed:
                self._cond.wait()
            if block and not self._inbox and self._closed:
                return None
            new, self._inbox = self._inbox, []
            return new

    def _sleep(self, seconds: float) -> None:
        """Wait up to `seconds`, less if a job arrives or the queue closes."""
        with self._cond:
            if not self._inbox and not self._closed:
                self._cond.wait(seconds)

    def _add(self, jobs: deque[Job], new: list[Job]) -> deque[Job]:
        """`jobs` with the new ones tokenized, less those done (refused, given up)."""
        for job in new:
            if self._prepare(job):
                jobs.append(job)
        return self._unfinished(jobs)

    def _prepare(self, job: Job) -> bool:
        """Tokenize a new job; False when it is done already (refused, given up, empty)."""
        if job.given_up(time.monotonic()) or self._abort:
            self._forget(len(job.texts), dropped=True)
            self._fail_given_up(job)
            return False
        try:
            job.prepare()
        except Exception as exc:  # noqa: BLE001 - NmtError (a line refused) or a bug: the job's
            if not isinstance(exc, NmtError):
                log.exception("model %s: preparing a request failed", self.name)
            self._forget(len(job.texts))
            _settle(job, exc=exc)
            return False
        if not job.texts:
            _settle(job, result=_finished(job))
            return False
        return True

    def _unfinished(self, jobs: deque[Job]) -> deque[Job]:
        """The jobs still to batch: not fully taken, not given up (client gone, deadline
        passed, stopping) or failed."""
        kept: deque[Job] = deque()
        now = time.monotonic()
        for job in jobs:
            if job.given_up(now) or self._abort:
                self._forget(len(job.texts) - job.taken, dropped=True)
                self._fail_given_up(job)
            elif job.taken < len(job.texts):
                kept.append(job)
        return kept

    def _forget(self, sentences: int, dropped: bool = False) -> None:
        """`sentences` leave the queue without a batch (`dropped`: given up)."""
        with self._cond:
            self._waiting -= sentences
        if dropped and sentences:
            self._dropped(sentences)

    def _fail_given_up(self, job: Job) -> None:
        """Settle a job dropped unfinished (when nothing settled it yet): Closed when the
        queue is closing, else Expired (its deadline passed)."""
        if self._abort:
            _settle(job, exc=Closed(f"model {self.name} is stopping"))
        else:
            _settle(job, exc=Expired(f"model {self.name}: not decoded before the deadline"))

    def _dropped(self, sentences: int) -> None:
        with self._cond:  # clients that left are not expected back: wait for no more of them
            self._peak = [min(self._peak[0], self._waiting + self._running), 0]
        if self.on_drop is not None:
            self.on_drop(sentences)

    def _wait_for_more(self, jobs: deque[Job], now: float) -> float:
        """Seconds worth waiting for more sentences before decoding (<= 0: decode now)."""
        head = jobs[0]
        if not head.merge or self._closed:
            return 0.0
        count, longest = 0, 0
        for job in jobs:
            if job.kind != head.kind:
                continue
            for i in range(job.taken, len(job.texts)):
                cost = job.cost(i)
                if cost:
                    count += 1
                    longest = max(longest, cost)
        if count >= self.max_sentences or (
            self.max_tokens and (count + 1) * longest > self.max_tokens
        ):
            return 0.0  # a full batch is there
        with self._cond:
            if self._waiting >= self._expected_load(now):
                return 0.0  # no more are expected
            since = max(self._free_since, head.arrived)
            quiet = max(self._free_since, self._last_arrival) + self.wait_gap
        return min(since + self.max_wait, quiet) - now

    def _take(self, jobs: deque[Job]) -> list[tuple[Job, int]]:
        """The next batch: the oldest job's kind, round-robin over its jobs, within the
        batch limits (a sampling job: all of it)."""
        head = jobs[0]
        batch: list[tuple[Job, int]] = []
        if not head.merge:
            batch = [(head, i) for i in range(head.taken, len(head.texts))]
            head.taken = len(head.texts)
            return batch
        same = [j for j in jobs if j.kind == head.kind]
        count, longest = 0, 0
        while True:
            progressed = False
            for job in same:
                if job.taken == len(job.texts):
                    continue
                cost = job.cost(job.taken)
                if cost:  # empty lines cost nothing and ride along
                    wider = max(longest, cost)
                    over = count + 1 > self.max_sentences or (
                        self.max_tokens and (count + 1) * wider > self.max_tokens
                    )
                    if over and count:
                        return batch
                    count, longest = count + 1, wider
                batch.append((job, job.taken))
                job.taken += 1
                progressed = True
            if not progressed:
                return batch

    def _note_load(self, now: float) -> None:
        """Remember the most sentences in the server at once (this window and the last)."""
        if now - self._window_start > LOAD_WINDOW:
            stale = now - self._window_start > 2 * LOAD_WINDOW
            self._peak = [0, 0 if stale else self._peak[0]]
            self._window_start = now
        self._peak[0] = max(self._peak[0], self._waiting + self._running)

    def _expected_load(self, now: float) -> int:
        if now - self._window_start > 2 * LOAD_WINDOW:
            return 1
        return max(self._peak)


def _fit(encoder, texts: Sequence[str]) -> list[np.ndarray]:
    """Ids of each text within the model's positions (cut with a warning, or refused)."""
    return [encoder.fit(ids, i) for i, ids in enumerate(encoder.to_ids(encoder.normalize(texts)))]


class _Cancelled:
    """translate_ids' `cancelled` for one batch: the positions of the sentences whose
    job was given up (all of them once the queue is closing with cancel). A step costs a
    clock read and a counter compare until a job of the queue is cancelled or a deadline
    of the batch passes; then each job of the batch is checked."""

    def __init__(self, batch: list[tuple[Job, int]], queue: BatchQueue):
        self.queue = queue
        self.positions: dict[int, tuple[Job, list[int]]] = {}  # id(job) -> its positions
        for position, (job, _) in enumerate(batch):
            self.positions.setdefault(id(job), (job, []))[1].append(position)
        self.size = len(batch)
        self.cancellations = queue.cancellations  # as the batch starts
        deadlines = [job.deadline for job, _ in self.positions.values() if job.deadline]
        self.earliest = min(deadlines, default=math.inf)

    def jobs(self) -> list[Job]:
        """The batch's jobs given up (now)."""
        now = time.monotonic()
        return [job for job, _ in self.positions.values() if job.given_up(now)]

    def __call__(self) -> list[int]:
        queue = self.queue
        if queue._abort:
            return list(range(self.size))
        now = time.monotonic()
        if queue.cancellations == self.cancellations and now <= self.earliest:
            return []  # nothing given up since the batch started
        gone: list[int] = []
        for job, positions in self.positions.values():
            if job.given_up(now):
                gone += positions
        return gone


def _run(head: Job, batch: list[tuple[Job, int]], cancelled: _Cancelled) -> list[Any]:
    """One Translator call for the batch (all of one kind): results in batch order; the
    sentences of jobs given up meanwhile stop at the next step (their results: [])."""
    sources = [job.sources[i] for job, i in batch]
    translator, search = head.translator, head.search
    assert search is not None
    # each sentence's languages: a batch mixes target languages (the tag is per sentence)
    langs = {
        "tgt_lang": _per_sentence(batch, lambda job: job.tgt_langs),
        "src_lang": _per_sentence(batch, lambda job: _each(job.src_lang, len(job.texts))),
    }
    if head.op == SCORE:
        targets = [job.target_ids[i] for job, i in batch]  # type: ignore[index]
        return translator.score_ids(sources, targets, lenpen=search.lenpen, **langs)
    # the head's search, as options of this call (sampling: a stream of its own from seed)
    options = {**dataclasses.asdict(search), "nbest": max(job.nbest for job, _ in batch)}
    hyps = translator.translate_ids(
        sources,
        prefixes=_per_sentence(batch, lambda job: job.prefix_ids),
        constraints=_per_sentence(batch, lambda job: job.constraint_ids),
        alignment=head.alignment,
        cancelled=cancelled,
        **langs,
        **options,
    )
    # nbest only cuts the finished list (best first), so fewer is a prefix of more.
    return [h[: job.nbest] for (job, _), h in zip(batch, hyps)]


def _per_sentence(
    batch: list[tuple[Job, int]], values: Callable[[Job], Sequence[Any] | None]
) -> list[Any] | None:
    """Each sentence's entry of its job's `values` (None for a job without), or None
    when no job of the batch has any."""
    per_job = [values(job) for job, _ in batch]
    if all(v is None for v in per_job):
        return None
    return [None if v is None else v[i] for v, (_, i) in zip(per_job, batch)]


def _each(value: str | None, n: int) -> list[str] | None:
    return None if value is None else [value] * n


def _deliver(batch: list[tuple[Job, int]], outcome: list[Any] | Exception) -> None:
    """Hand each job its results; a failure fails every job of the batch."""
    if isinstance(outcome, Exception):
        for job in {id(j): j for j, _ in batch}.values():
            _settle(job, exc=outcome)
        return
    now = time.monotonic()
    for (job, i), result in zip(batch, outcome):
        job.results[i] = result
        job.left -= 1
        # (a job given up may lack results: its sentences stopped mid-batch)
        if job.left == 0 and not job.given_up(now):
            try:
                answer = _finished(job)
            except Exception as exc:  # noqa: BLE001 - a bug in finish: this request's error
                log.exception("finishing a request failed")
                _settle(job, exc=exc)
            else:
                _settle(job, result=answer)


def _finished(job: Job) -> Any:
    if job.constraint_ids is not None:
        job.warnings += job.unmet()
    return job.finish(job) if job.finish is not None else job.results


def _settle(job: Job, result: Any = None, exc: BaseException | None = None) -> None:
    """Complete a job's future unless its request gave up already."""
    try:
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)
    except InvalidStateError:  # cancelled meanwhile (timeout)
        pass
