"""nmt.serving.batching.BatchQueue on a tiny checkpoint trained here: batching across jobs
never changes a translation, batches keep their limits, a lone job does not wait, jobs that
give up or fail leave the others alone, sampling jobs are reproducible."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

from nmt import Translator
from nmt.errors import NmtError
from nmt.generation.encoding import target_ids
from nmt.serving.batching import SCORE, BatchQueue, Closed, Expired, Job, Overloaded, QueueFull
from tests.helpers import run_training, tiny_config
from tests.rounding import text_logprob_tolerance

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = dict(beam=4, max_len_a=1.0, max_len_b=5)


@pytest.fixture(scope="module")
def checkpoint(demo_data_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("serving-batching-run")
    run_training(tiny_config(demo_data_dir, run, max_update=60))
    return run / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.from_checkpoint(checkpoint, device="cpu", nbest=2, **SEARCH)


@pytest.fixture(scope="module")
def texts(demo_corpus) -> list[str]:
    lines = (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:24]
    lines[5] = ""  # an empty line rides along
    return lines


def _job(translator: Translator, texts, **options) -> Job:
    """A job with the translator's search, `options` over it (as a request's; nbest=1
    unless given)."""
    kw = {k: options.pop(k) for k in ("kind", "finish", "alignment") if k in options}
    search = translator.search_with(**{"nbest": 1, **options})
    return Job(translator, texts=texts, search=search, **kw)


def _pieces(translator: Translator, results) -> list[list[list[str]]]:
    """Pieces per hypothesis; an empty text has none ([]), translate_batch's one empty."""
    return [[translator.pieces(target_ids(h)) for h in hyps] or [[]] for hyps in results]


def _wanted(translator: Translator, texts, nbest: int) -> list[list[list[str]]]:
    return [[t.pieces for t in per] for per in translator.translate_batch(texts, nbest=nbest)]


@pytest.fixture
def queue_factory():
    made: list[BatchQueue] = []

    def make(**kw) -> BatchQueue:
        kw.setdefault("max_sentences", 8)
        batches: list[int] = []
        q = BatchQueue("test", on_batch=lambda n, s: batches.append(n), **kw)
        q.batches = batches  # type: ignore[attr-defined]
        made.append(q)
        return q

    yield make
    for q in made:
        q.close(30)


def test_concurrent_jobs_equal_direct_calls(translator, texts, queue_factory):
    """Jobs of many sizes and nbests, submitted from several threads at once, share
    batches and still get exactly Translator.translate_batch's hypotheses."""
    queue = queue_factory(max_sentences=8, max_wait=0.05)
    jobs = [(texts[i : i + size], 1 + i % 2) for i, size in enumerate([1, 3, 1, 7, 2, 1, 5, 4])]
    futures: list = [None] * len(jobs)

    def submit(k: int) -> None:
        part, nbest = jobs[k]
        futures[k] = queue.submit(_job(translator, part, nbest=nbest))

    threads = [threading.Thread(target=submit, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (part, nbest), future in zip(jobs, futures):
        results = future.result(timeout=120)
        assert _pieces(translator, results) == _wanted(translator, part, nbest)
        assert all(len(h) == nbest for text, h in zip(part, results) if text)
    assert max(queue.batches) <= 8  # the batch limit holds
    assert len(queue.batches) < len(jobs)  # and jobs did share batches


def test_jobs_with_other_searches_share_no_batch(translator, texts, queue_factory):
    """Jobs whose searches differ (but in nbest) are decoded in batches of their own, each
    as a Translator call with its options: batching changes no answer."""
    queue = queue_factory(max_sentences=16, max_wait=0.5)
    variants = [{}, dict(beam=2), dict(lenpen=0.6), dict(nbest=2), {}]
    with queue._cond:  # queued together: the worker sees them all at once
        futures = [queue.submit(_job(translator, texts[:4], **o)) for o in variants]
    for options, future in zip(variants, futures):
        want = translator.translate_batch(texts[:4], **{"nbest": 1, **options})
        assert _pieces(translator, future.result(timeout=120)) == [
            [t.pieces for t in per] for per in want
        ]
    # the default search's three jobs (nbest 1, 2, 1) shared one batch; the others, one each
    assert sorted(queue.batches) == [4, 4, 12]


def test_round_robin_lets_a_short_job_through(translator, texts, queue_factory):
    """A 20-sentence job and a 1-sentence job queued together: the short one is in the
    first batch, not behind the long one's batches."""
    queue = queue_factory(max_sentences=4, max_wait=1.0)
    order: list[str] = []
    long_job = _job(translator, texts[:20])
    short_job = _job(translator, texts[20:21])
    with queue._cond:  # both arrive before the worker looks
        long_future = queue.submit(long_job)
        short_future = queue.submit(short_job)
    long_future.add_done_callback(lambda f: order.append("long"))
    short_future.add_done_callback(lambda f: order.append("short"))
    short_future.result(timeout=120)
    long_future.result(timeout=120)
    assert order == ["short", "long"]
    assert queue.batches[0] == 4 and max(queue.batches) <= 4


def test_a_lone_job_does_not_wait(translator, texts, queue_factory):
    queue = queue_factory(max_wait=30.0)  # it would wait that long for company
    start = time.monotonic()
    queue.submit(_job(translator, texts[:2])).result(timeout=60)
    assert time.monotonic() - start < 10


def test_max_tokens_bounds_the_padded_batch(translator, texts, queue_factory, monkeypatch):
    """Each batch holds at most max_tokens padded source tokens (sentences x longest)."""
    from nmt.serving import batching

    padded: list[int] = []
    run = batching._run

    def recording(head, batch, cancelled):
        costs = [job.cost(i) for job, i in batch if job.cost(i)]
        padded.append(len(costs) * max(costs))
        return run(head, batch, cancelled)

    monkeypatch.setattr(batching, "_run", recording)
    queue = queue_factory(max_sentences=64, max_tokens=60, max_wait=0.0)
    job = _job(translator, texts)
    got = queue.submit(job).result(timeout=120)
    assert _pieces(translator, got) == _wanted(translator, texts, 1)
    assert len(padded) > 1 and max(padded) <= 60
    assert sum(queue.batches) == len(texts) - 1  # all but the empty line


def test_cancelled_jobs_are_skipped_and_failures_stay_with_their_job(
    checkpoint, translator, texts, queue_factory
):
    strict = Translator.from_checkpoint(checkpoint, device="cpu", overlong="error", **SEARCH)
    queue = queue_factory(max_wait=0.0)
    too_long = " ".join(["one"] * 2000)
    with queue._cond:
        given_up = queue.submit(_job(translator, texts[:6]))
        given_up.cancel()
        refused = queue.submit(_job(strict, ["one", too_long], kind="strict"))
        fine = queue.submit(_job(translator, texts[6:9]))
    assert _pieces(translator, fine.result(timeout=120)) == _wanted(translator, texts[6:9], 1)
    with pytest.raises(NmtError, match=r"^texts:2: \d+ tokens, the model accepts \d+"):
        refused.result(timeout=120)
    with pytest.raises(CancelledError):
        given_up.result(timeout=1)
    assert sum(queue.batches) == 3  # the cancelled job's sentences were never decoded
    assert queue.queued == 0


def test_queue_full_and_closed(translator, texts, queue_factory):
    queue = queue_factory(max_queue=5, max_wait=0.0)
    with queue._cond:  # the worker cannot take anything meanwhile
        queue.submit(_job(translator, texts[:4]))
        with pytest.raises(QueueFull):
            queue.submit(_job(translator, texts[:2]))
    queue.close(60)
    with pytest.raises(Closed):
        queue.submit(_job(translator, texts[:1]))


def test_close_finishes_what_is_queued(translator, texts, queue_factory):
    queue = queue_factory(max_wait=10.0)
    futures = [queue.submit(_job(translator, texts[i : i + 2])) for i in range(0, 8, 2)]
    queue.close(120)
    assert all(f.done() and not f.cancelled() for f in futures)
    assert _pieces(translator, futures[1].result()) == _wanted(translator, texts[2:4], 1)


def test_sampling_jobs_are_alone_and_reproducible(translator, checkpoint, texts, queue_factory):
    queue = queue_factory(max_wait=0.05)
    jobs = [_job(translator, texts[:5], sampling=True, seed=7, nbest=1) for _ in range(3)]
    assert not any(job.merge for job in jobs)
    with queue._cond:
        futures = [queue.submit(job) for job in jobs]
        plain = queue.submit(_job(translator, texts[5:9]))
    results = [_pieces(translator, f.result(timeout=120)) for f in futures]
    fresh = Translator.from_checkpoint(
        checkpoint, device="cpu", sampling=True, seed=7, **SEARCH
    ).translate_batch(texts[:5])
    assert results[0] == results[1] == results[2] == [[t.pieces for t in per] for per in fresh]
    assert _pieces(translator, plain.result(timeout=120)) == _wanted(translator, texts[5:9], 1)
    assert 5 in queue.batches  # each sampling job was a batch of its own


def test_score_jobs_equal_translator_score(translator, texts, queue_factory, demo_corpus):
    refs = (demo_corpus / "test.de").read_text(encoding="utf-8").splitlines()[: len(texts)]
    queue = queue_factory(max_wait=0.0)
    job = Job(translator, texts=texts, op=SCORE, targets=refs)
    got = queue.submit(job).result(timeout=120)
    want = translator.score(texts, refs)
    tolerance = text_logprob_tolerance(translator, texts, refs)  # tests/rounding.py
    for h, w in zip(got, want):
        assert h.positional_scores.tolist() == pytest.approx(w.token_scores, abs=tolerance)
        assert h.score == pytest.approx(w.score, abs=tolerance)  # means (lenpen 1)
    search = translator.search_with(lenpen=0.5)
    halved = Job(translator, texts=texts, op=SCORE, targets=refs, search=search)
    got = queue.submit(halved).result(timeout=120)
    want = translator.score(texts, refs, lenpen=0.5)
    for h, w in zip(got, want):
        assert h.score == pytest.approx(w.score, abs=tolerance)


def test_finish_runs_on_the_worker_and_answers(translator, texts, queue_factory):
    queue = queue_factory(max_wait=0.0)
    seen: list[str] = []

    def finish(job: Job) -> int:
        seen.append(threading.current_thread().name)
        return len(job.results)

    assert queue.submit(_job(translator, texts[:3], finish=finish)).result(timeout=60) == 3
    assert seen == ["nmt-serve-test"]
    empty = queue.submit(_job(translator, [], finish=finish))
    assert empty.result(timeout=60) == 0


def test_clients_that_send_again_fill_batches(translator, texts, queue_factory):
    """8 closed-loop clients (each sends its next sentence when answered): once the
    worker has seen them all in the server together, it waits for all 8 each time. The
    quiet gap it would stop waiting after is long (5 s), so that a loaded machine's slow
    thread wake-ups cannot split a batch: with 1 s they once did."""
    queue = queue_factory(max_sentences=64, max_wait=5.0, wait_gap=5.0)
    start = threading.Barrier(8)

    def client(k: int) -> None:
        start.wait()
        for i in range(4):
            queue.submit(_job(translator, [texts[(k + i) % len(texts)] or "one"])).result(120)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sum(queue.batches) == 32
    # the first batch may hold the first comers only (those clients are then a round
    # ahead, and the last batch is the others' last round); every batch between is full
    assert queue.batches.count(8) >= 3 and all(b == 8 for b in queue.batches[1:-1]), queue.batches


# -- work nobody waits for, deadlines and admission -------------------------------------

LONG = dict(min_len=150, max_len_b=150, max_len_a=0.0)  # every sentence decodes 150 steps


def _dropped(queue: BatchQueue) -> list[int]:
    dropped: list[int] = []
    queue.on_drop = dropped.append
    return dropped


def test_translate_ids_cancelled_sources_get_nothing_and_the_others_the_same(translator, texts):
    encoder = translator.source_encoder()
    sources = [encoder.fit(ids, i) for i, ids in enumerate(encoder.to_ids(texts[:6]))]
    want = translator.translate_ids(sources, **LONG)
    asked: list[int] = []

    def cancelled() -> list[int]:
        asked.append(1)
        return [1, 4] if len(asked) > 5 else []

    got = translator.translate_ids(sources, cancelled=cancelled, **LONG)
    assert got[1] == [] and got[4] == []
    for i in (0, 2, 3, 5):
        assert [h.tokens.tolist() for h in got[i]] == [h.tokens.tolist() for h in want[i]]
        assert [h.score for h in got[i]] == [h.score for h in want[i]]  # bitwise


def test_a_job_given_up_mid_batch_stops_at_the_next_step(translator, texts, queue_factory):
    """Two jobs share a batch; one is cancelled while it decodes: its sentences leave the
    batch (counted as dropped, not decoded) and the other's results are exact."""
    queue = queue_factory(max_wait=0.0)
    alone = time.monotonic()
    queue.submit(_job(translator, texts[:8], **LONG)).result(timeout=120)
    uncancelled = time.monotonic() - alone
    dropped = _dropped(queue)
    with queue._cond:
        left = queue.submit(_job(translator, texts[:4], **LONG))
        stays = queue.submit(_job(translator, texts[6:7], **LONG))
    time.sleep(uncancelled / 10)
    assert queue._running == 5  # one batch, decoding
    left.cancel()
    want = translator.translate_batch(texts[6:7], nbest=1, **LONG)
    assert _pieces(translator, stays.result(timeout=120)) == [[t.pieces for t in w] for w in want]
    assert dropped == [4] and queue.batches[-1] == 1


def test_jobs_past_their_deadline_are_dropped_before_decoding(translator, texts, queue_factory):
    queue = queue_factory(max_wait=0.0)
    dropped = _dropped(queue)
    with queue._cond:  # the worker takes nothing meanwhile
        late = _job(translator, texts[:3])
        late.deadline = time.monotonic() + 0.05
        late_future = queue.submit(late)
        fine = queue.submit(_job(translator, texts[6:8]))
        time.sleep(0.1)
    assert _pieces(translator, fine.result(timeout=120)) == _wanted(translator, texts[6:8], 1)
    assert dropped == [3] and queue.batches == [2]
    with pytest.raises(Expired):
        late_future.result(timeout=1)


def test_admission_refuses_what_cannot_finish_before_the_deadlines(
    translator, texts, queue_factory
):
    """Once the queue has measured its speed, a job that would make the queued work end
    after the earliest deadline waiting is refused at once; an idle queue admits all."""
    queue = queue_factory(max_wait=0.0)

    def job(seconds: float | None) -> Job:
        made = _job(translator, texts[:8], **LONG)
        made.deadline = None if seconds is None else time.monotonic() + seconds
        return made

    start = time.monotonic()
    queue.submit(job(None)).result(timeout=120)  # measured: about `took` per such job
    took = time.monotonic() - start
    with pytest.raises(Expired):  # idle: admitted (then too late)
        queue.submit(job(took / 100)).result(timeout=120)
    with queue._cond:  # nothing decodes meanwhile: two such jobs queued
        first = queue.submit(job(10 * took))
        queue.submit(job(10 * took))
        with pytest.raises(Overloaded, match=r"about \d+\.\d s of decoding would be queued") as e:
            queue.submit(job(2.5 * took))  # three jobs' work in 2.5 jobs' time
        assert e.value.retry_after >= 1
        first.cancel()  # one job less queued: the third one fits
        queue.submit(job(2.5 * took))
    assert queue.submit(job(None))  # no deadline: never refused
