"""What every route does with text: check the limits, queue a Job on the model's
BatchQueue, and await its answer within the request timeout (a job is refused at once
when it could not be done in time, and cancelled as soon as its client leaves, its time
is up or the server halts: batching.py). The model's worker turns
text into ids, decodes, and builds the answer (the `finish` functions here), so the event
loop only parses requests and writes JSON. The routes (libretranslate.py, native.py) only
parse and shape answers.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.generation.encoding import PieceNames, target_ids
from nmt.generation.terminology import Glossary, TextConstraints, parse_constraints
from nmt.generation.translator import TargetScore, Translation
from nmt.serving.batching import SCORE, Closed, Expired, Invalid, Job, Overloaded, QueueFull
from nmt.serving.config import ServeConfig
from nmt.serving.disconnect import client_gone
from nmt.serving.errors import ApiError, bad_request, too_large
from nmt.serving.models import AUTO, ModelRegistry, ServedModel

STOPPING = "the server is stopping; retry on another"


@dataclass(frozen=True)
class Route:
    """Where a request goes: its model, its source language (given, or found for
    "auto"; None when not known) and what to ask of the model: the Translator's src_lang
    and tgt_lang (one, or one per text; None for a single-pair model)."""

    model: ServedModel
    source: str | None
    src_lang: str | None
    tgt_lang: str | list[str] | None


@dataclass
class Answer:
    """A job's answer (what its `finish` built) and the warnings about its input."""

    value: Any
    warnings: list[str]


def bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header (the scheme in any case)."""
    scheme, _, key = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def _utf8(key: str) -> bytes:
    return key.encode("utf-8", "surrogatepass")  # a key that is not text is just not the key


class Service:
    """The server's translation work over its models (None while they load)."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.models: ModelRegistry | None = None
        self.source_pieces: dict[str, PieceNames] = {}
        self.stopping: str | None = None  # halt()'s message: every request is refused
        self._halted: asyncio.Future | None = None  # done once halted (in its loop)

    def ready(self, models: ModelRegistry) -> None:
        self.source_pieces = {m.name: PieceNames(m.translator.src_tokenizer) for m in models.models}
        self.models = models

    def halt(self, message: str) -> None:
        """Answer every request waiting for its translations now, and every new one,
        with a 503 that says `message` (the server is stopping); their jobs are
        cancelled, so the workers drop them at the next decoding step. Call it in the
        server's event loop."""
        self.stopping = message
        halted = self._halted
        if halted is not None and not halted.done() and not halted.get_loop().is_closed():
            halted.set_result(None)

    def _halt_signal(self) -> asyncio.Future:
        """A future of this loop that halt() completes."""
        loop = asyncio.get_running_loop()
        if self._halted is None or self._halted.get_loop() is not loop:
            self._halted = loop.create_future()
            if self.stopping is not None:
                self._halted.set_result(None)
        return self._halted

    def registry(self) -> ModelRegistry:
        if self.models is None:
            raise ApiError(503, "the models are loading; retry in a moment", kind="loading")
        return self.models

    def find(
        self,
        name: str | None,
        source: str | None,
        target: str | Sequence[str] | None,
        keys: tuple[str, str] = ("source", "target"),
    ) -> Route:
        """A model by name, else by the direction asked for, else the only one; with the
        languages to ask of it (ServedModel.request_languages: a 400 for a language it
        does not know). `target`: one language, or one per text; `keys` name `source`
        and `target` in messages."""
        models = self.registry()
        if name is None and (source or target):
            if not target:
                raise bad_request(f"{keys[1]}=null: give {keys[0]} and {keys[1]}, or model=")
            model, source = models.for_pair(source, target, keys)
        else:
            model = models.named(name)
        src_lang, tgt_lang = model.request_languages(source, target, keys)
        return Route(model, source if source != AUTO else None, src_lang, tgt_lang)

    def check_key(self, given: str | None, authorization: str | None = None) -> None:
        """The request's API key must be the server's, when the server has one: `given`
        (api_key in its body, form or query string), else its `Authorization: Bearer KEY`
        header."""
        want = self.cfg.api_key
        if want is None:
            return
        key = given or bearer(authorization)
        if key is None or not hmac.compare_digest(_utf8(key), _utf8(want)):
            raise ApiError(
                403,
                "api_key: missing or not this server's; send the key as api_key (or in an "
                "Authorization: Bearer header)",
                kind="unauthorized",
            )

    def check_size(self, what: str, texts: Sequence[str], extra_chars: int = 0) -> None:
        """Characters and sentences per request (413 beyond them)."""
        chars = sum(len(t) for t in texts) + extra_chars
        if chars > self.cfg.max_request_chars:
            raise too_large(
                f"{what}: {chars} characters, more than this server takes in one request "
                f"({self.cfg.max_request_chars}); send the text in several requests"
            )
        if len(texts) > self.cfg.max_request_sentences:
            raise too_large(
                f"{what}: {len(texts)} sentences, more than this server takes in one request "
                f"({self.cfg.max_request_sentences}); send them in several requests"
            )

    def search(self, model: ServedModel, options: Mapping[str, Any]) -> SearchConfig:
        """The model's search with the request's search options over it (None: not
        given), made as the Translator makes a call's (Translator.search_with) and within
        max_beam; an error is a 400."""
        given = {k: v for k, v in options.items() if v is not None}
        if not given:
            return model.search
        try:
            search = model.translator.search_with(**given)
            self.cfg.check_beam(search.beam)
        except NmtError as exc:
            raise bad_request(str(exc)) from None
        return search

    async def translate(
        self,
        model: ServedModel,
        texts: Sequence[str],
        finish: Callable[[Job], Any],
        *,
        search: SearchConfig,
        prefixes: Sequence[str | None] | None = None,
        constraints: Sequence[TextConstraints | None] | None = None,
        glossary: Glossary | None = None,
        alignment: bool = False,
        where: str = "texts",
        src_lang: str | None = None,
        tgt_lang: str | Sequence[str] | None = None,
    ) -> Answer:
        """Translate `texts` (each one sentence) with `search` (Service.search: up to
        search.nbest translations each) through the model's queue; `finish(job)` builds
        the answer from job.results (hypotheses per text) in the worker (texts_of,
        translations_of). `constraints` (one per text, request_constraints) and the
        request's `glossary` (request_glossary), which goes over the model's.
        `src_lang`/`tgt_lang`: a multilingual model's languages (Route), tgt_lang one or
        one per text."""
        if prefixes is not None and len(prefixes) != len(texts):
            raise bad_request(
                f"prefixes: {len(prefixes)} of them for {len(texts)} texts; give one "
                "prefix (or null) per text"
            )
        job = Job(
            model.translator,
            texts=texts,
            search=search,
            prefixes=prefixes,
            constraints=constraints,
            glossary=glossary,
            model_glossary=model.glossary,
            alignment=alignment,
            where=where,
            finish=finish,
            src_lang=src_lang,
            tgt_lang=tgt_lang,
        )
        return await self._run(model, job)

    async def score(
        self,
        model: ServedModel,
        sources: Sequence[str],
        targets: Sequence[str],
        search: SearchConfig,
        src_lang: str | None = None,
        tgt_lang: str | Sequence[str] | None = None,
    ) -> Answer:
        """Forced decoding of each target given its source: TargetScores (as
        Translator.score gives them)."""
        if len(sources) != len(targets):
            raise bad_request(
                f"targets: {len(targets)} of them for {len(sources)} sources; give one "
                "target per source"
            )
        job = Job(
            model.translator,
            texts=sources,
            search=search,
            op=SCORE,
            targets=targets,
            where="sources",
            finish=target_scores,
            src_lang=src_lang,
            tgt_lang=tgt_lang,
        )
        return await self._run(model, job)

    async def _run(self, model: ServedModel, job: Job) -> Answer:
        """Queue the job with its deadline (request_timeout from now) and await it; the
        job is cancelled (dropped from the queue, or from its batch at the next step) as
        soon as nobody waits for it: its client left, its deadline passed, or halt()."""
        timeout = self.cfg.request_timeout
        if self.stopping is not None:
            raise ApiError(503, self.stopping, kind="stopping")
        job.deadline = time.monotonic() + timeout
        try:
            future = model.queue.submit(job)
        except QueueFull:
            raise ApiError(
                503,
                f"model {model.name}: {model.queue.queued} sentences are waiting already "
                f"(max_queue={self.cfg.max_queue}); retry in a moment",
                kind="busy",
            ) from None
        except Overloaded as exc:
            raise ApiError(
                503,
                f"request_timeout={timeout:g}: {exc}; retry in {exc.retry_after} s, or send "
                "fewer sentences",
                kind="overloaded",
                retry_after=exc.retry_after,
            ) from None
        except Closed:
            raise ApiError(503, STOPPING, kind="stopping") from None
        answer = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(client_gone())
        halted = self._halt_signal()
        try:
            done, _ = await asyncio.wait(
                (answer, gone, halted),
                timeout=job.deadline - time.monotonic(),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            gone.cancel()
            answer.cancel()  # (done already, or nobody waits: the worker drops the job)
        if answer in done:
            try:
                value = answer.result()
            except Invalid as exc:  # a constraint the model cannot take
                raise bad_request(str(exc)) from None
            except NmtError as exc:  # a line the model refuses (overlong=error)
                raise too_large(str(exc)) from None
            except Closed:
                raise ApiError(503, STOPPING, kind="stopping") from None
            except Expired:  # the worker saw the deadline pass first
                raise self._timed_out() from None
            return Answer(value, job.warnings)
        if halted in done:
            raise ApiError(503, self.stopping or STOPPING, kind="stopping")
        if gone in done:  # nobody reads this answer; 499 as nginx logs it
            raise ApiError(499, "the client closed the connection", kind="gone")
        raise self._timed_out()

    def _timed_out(self) -> ApiError:
        return ApiError(
            503,
            f"request_timeout={self.cfg.request_timeout:g}: not translated in time (the "
            "server is busy); retry later, or send fewer sentences",
            kind="timeout",
        )


# -- a request's terminology -----------------------------------------------------------


def request_constraints(value: Any, texts: int) -> list[TextConstraints | None] | None:
    """A request's `constraints`: one entry per text (a list of phrases, {"include":
    [...], "exclude": [...]}, or null), parsed as Translator.translate_batch parses its
    own; a 400 naming the entry (`constraints[2]: ...`) for what it cannot be."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request(
            "constraints: not a list; give one entry per text: a list of phrases, "
            '{"include": [...], "exclude": [...]}, or null'
        )
    if len(value) != texts:
        raise bad_request(
            f"constraints: {len(value)} of them for {texts} texts; give one entry (or null) "
            "per text"
        )
    try:
        return [
            None if c is None else parse_constraints(c, f"constraints[{i}]")
            for i, c in enumerate(value)
        ]
    except NmtError as exc:
        raise bad_request(str(exc)) from None


def request_glossary(value: Any) -> Glossary | None:
    """A request's `glossary`: a JSON object, source term -> target term; a 400 saying
    what is wrong with it."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request('glossary: not a JSON object; give {"source term": "target term"}')
    try:
        return Glossary.of(value)  # its errors name the entry: glossary["term"]: ...
    except NmtError as exc:
        raise bad_request(str(exc)) from None


def json_chars(value: Any) -> int:
    """Characters of the strings (object keys too) in a parsed JSON value."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(str(k)) + json_chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(json_chars(v) for v in value)
    return 0


# -- answers, built by the model's worker (Job.finish) ----------------------------------


def texts_of(job: Job) -> list[list[str]]:
    """Per text, the text of each translation, best first ([""] for an empty text)."""
    decode = job.translator.tgt_tokenizer.decode
    return [[decode(target_ids(h)) for h in hyps] or [""] for hyps in job.results]


def translations_of(
    scores: bool, alignment: bool, attention: PieceNames | None
) -> Callable[[Job], list[dict]]:
    """finish for nmt's API: per text {"translations": [...]} as Translator.translate_batch
    gives them, and with `attention` (the source's piece names) the best translation's
    cross-attention."""

    def finish(job: Job) -> list[dict]:
        translator = job.translator
        constrained = job.constraint_ids is not None
        wanted = job.constraint_ids or [None] * len(job.sources)
        out = []
        for src, hyps, constraints in zip(job.sources, job.results, wanted):
            translations = translator.translations(
                hyps, len(src), scores=scores, alignment=alignment, constraints=constraints
            )
            result: dict[str, Any] = {
                "translations": [_translation(t, constrained) for t in translations]
            }
            if attention is not None:
                result["attention"] = _attention(job, src, hyps, attention)
            out.append(result)
        return out

    return finish


def target_scores(job: Job) -> list[TargetScore]:
    pieces = job.translator.pieces
    return [
        TargetScore(
            log_prob=float(h.positional_scores.sum()),
            token_scores=h.positional_scores.tolist(),
            score=h.score,
            pieces=pieces(target_ids(h)),
        )
        for h in job.results
    ]


def _translation(t: Translation, constrained: bool) -> dict:
    """A Translation as JSON; `constrained`: its request had constraints or a glossary."""
    out: dict[str, Any] = {"text": t.text, "pieces": t.pieces}
    if t.score is not None:  # JSON has no -inf: null (a search that every rule forbade)
        out["score"] = _finite(t.score)
        out["token_scores"] = [_finite(s) for s in t.token_scores or []]
    if t.alignment is not None:
        out["alignment"] = [list(pair) for pair in t.alignment]
    if constrained:
        out["constraints_met"] = t.constraints_met
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _attention(job: Job, src, hyps, source_pieces: PieceNames) -> dict:
    """The best hypothesis' cross-attention: rows are its target pieces (then </s>),
    columns the source pieces (then </s>)."""
    if not hyps or hyps[0].attention is None:
        return {"source": [], "target": [], "weights": []}
    h = hyps[0]
    weights = h.attention[: len(h.tokens), : len(src)]  # [T,S]
    return {
        "source": source_pieces(src.tolist()),
        "target": job.translator.pieces(h.tokens.tolist()),
        "weights": [[round(w, 4) for w in row] for row in weights.tolist()],
    }
