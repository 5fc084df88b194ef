"""Admission by deadline: a new request is queued only when all the work queued, its own
included, can be decoded before the earliest deadline among the requests waiting (its
own included); otherwise it is refused at once (503 with Retry-After), so overload costs
refused requests instead of requests queued to time out together (jobs of a kind share
batches round-robin, so one admitted too many would delay every one of them).

Work is counted in units: a sentence's characters (+1) times the rows it decodes (its
beam; 1 for scoring). Decoding time per unit is measured as the server goes: a moving
average over the translation batches decoded in full. The bound is serial (whatever the
order of the batches, everything queued is done by then), so no admitted request is
pushed past its deadline by a later one, as far as the measured speed holds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from typing import Protocol

SMOOTHING = 0.3  # weight of the newest batch in the moving average of seconds per unit


class Work(Protocol):
    """What the estimate reads of a queued job (batching.Job)."""

    texts: Sequence[str]  # its sentences
    taken: int  # sentences handed to a batch so far
    work: float  # units of all its sentences
    deadline: float | None  # time.monotonic() by which it must be answered


def units(texts: Iterable[str], rows: int) -> float:
    """The work of decoding `texts` with `rows` rows each (a beam's hypotheses)."""
    return float(sum(len(t) + 1 for t in texts) * rows)


class Backlog:
    """The work queued (units of the sentences not in a batch yet) and the earliest
    deadline among the jobs it belongs to, kept up to date as jobs come, are batched and
    leave: O(log n) a job, so admission costs the same with 10 jobs waiting or 4,000."""

    def __init__(self) -> None:
        self.work = 0.0  # units queued
        self._queued: dict[int, float] = {}  # id(job) -> its units still queued
        self._deadlines: list[tuple[float, int, Work]] = []  # heap: (deadline, id, job)

    def add(self, job: Work) -> None:
        self._queued[id(job)] = job.work
        self.work += job.work
        if job.deadline is not None:
            heapq.heappush(self._deadlines, (job.deadline, id(job), job))

    def left(self, job: Work, sentences: int) -> None:
        """`job` now has `sentences` not in a batch yet (0: none; it left the queue)."""
        old = self._queued.get(id(job))
        if old is None:
            return
        units = job.work * sentences / len(job.texts) if sentences > 0 else 0.0
        if units:
            self._queued[id(job)] = units
        else:
            del self._queued[id(job)]
        # float drift: exactly 0 once nothing is queued
        self.work = max(0.0, self.work - old + units) if self._queued else 0.0

    def earliest(self, now: float) -> float | None:
        """The earliest deadline among the jobs with work queued; jobs past theirs leave
        the backlog (the worker drops them before decoding)."""
        heap = self._deadlines
        while heap:
            deadline, key, job = heap[0]
            if key in self._queued and deadline >= now:
                return deadline
            heapq.heappop(heap)
            self.left(job, 0)
        return None


class WorkEstimate:
    """Seconds of decoding ahead, from the measured seconds per unit."""

    def __init__(self) -> None:
        self.unit_seconds: float | None = None  # None until a batch was measured

    def measured(self, work: float, seconds: float) -> None:
        """A batch of `work` units decoded in full in `seconds`."""
        if work <= 0:
            return
        rate = seconds / work
        old = self.unit_seconds
        self.unit_seconds = rate if old is None else old + SMOOTHING * (rate - old)

    def late(
        self, new: Work, backlog: Backlog, now: float, running_work: float, running_for: float
    ) -> tuple[float, float] | None:
        """(seconds until all the work would be done with `new` queued, seconds left to
        the earliest deadline) when that is too late; None to admit `new` (in time,
        nothing ahead of it, or nothing measured yet)."""
        rate = self.unit_seconds
        if rate is None or new.deadline is None:
            return None
        earliest = backlog.earliest(now)
        earliest = new.deadline if earliest is None else min(earliest, new.deadline)
        running = max(0.0, running_work * rate - running_for) if running_work else 0.0
        if not backlog.work and not running:
            return None  # an idle server always tries
        return running + (backlog.work + new.work) * rate, earliest


def retry_after(seconds: float) -> int:
    """Retry-After (whole seconds, at least 1) for work that clears in `seconds`."""
    return max(1, math.ceil(seconds)) if math.isfinite(seconds) else 1
