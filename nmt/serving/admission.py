"""Admission by deadline: how long the work ahead of a new request will take, so that
a request that cannot be answered before its deadline is refused at once (503 with
Retry-After) instead of queued to time out, with every request batched with it slowed.

Work is counted in units: a sentence's characters (+1) times the rows it decodes (its
beam; 1 for scoring). Decoding time per unit is measured as the server goes: a moving
average over the translation batches decoded in full. A new job waits for the batch
running now (its measured work, less the time it has run), then shares batches with the
queued jobs of its kind round-robin (each gives a sentence per round, so a job ahead
delays it by at most as many of its sentences as the new job has), while jobs of other
kinds (and sampling jobs, decoded alone) go before it whole.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Protocol

SMOOTHING = 0.3  # weight of the newest batch in the moving average of seconds per unit


class Work(Protocol):
    """What the estimate reads of a queued job (batching.Job)."""

    texts: Sequence[str]  # its sentences
    taken: int  # sentences handed to a batch so far
    work: float  # units of all its sentences
    kind: Hashable  # jobs of one kind may share a batch

    @property
    def merge(self) -> bool: ...  # False: decoded alone


def units(texts: Iterable[str], rows: int) -> float:
    """The work of decoding `texts` with `rows` rows each (a beam's hypotheses)."""
    return float(sum(len(t) + 1 for t in texts) * rows)


class WorkEstimate:
    """Seconds of decoding ahead of a new job, from the measured seconds per unit."""

    def __init__(self) -> None:
        self.unit_seconds: float | None = None  # None until a batch was measured

    def measured(self, work: float, seconds: float) -> None:
        """A batch of `work` units decoded in full in `seconds`."""
        if work <= 0:
            return
        rate = seconds / work
        old = self.unit_seconds
        self.unit_seconds = rate if old is None else old + SMOOTHING * (rate - old)

    def ahead(
        self, new: Work, queued: Iterable[Work], running_work: float, running_for: float
    ) -> float | None:
        """Seconds until `new` could be finished (its own decoding included), or None
        when nothing is ahead of it or nothing is measured yet (admit it)."""
        rate = self.unit_seconds
        if rate is None:
            return None
        sentences = len(new.texts)
        queued_work = 0.0
        for job in queued:
            left = len(job.texts) - job.taken
            if left <= 0:
                continue
            per_sentence = job.work / len(job.texts)
            shares = job.merge and new.merge and job.kind == new.kind
            queued_work += per_sentence * (min(left, sentences) if shares else left)
        running = max(0.0, running_work * rate - running_for) if running_work else 0.0
        if not queued_work and not running:
            return None  # an idle server always tries
        return running + (queued_work + new.work) * rate


def retry_after(seconds: float) -> int:
    """Retry-After (whole seconds, at least 1) for work that clears in `seconds`."""
    return max(1, math.ceil(seconds)) if math.isfinite(seconds) else 1
