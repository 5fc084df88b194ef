"""The admission backlog kept incrementally equals the work and earliest deadline
recomputed from every job, whatever the order in which jobs come, are batched and leave."""

from __future__ import annotations

import random
from dataclasses import dataclass

from nmt.serving.admission import Backlog, WorkEstimate, units


@dataclass(eq=False)
class _Job:
    texts: list[str]
    deadline: float | None
    taken: int = 0
    gone: bool = False

    @property
    def work(self) -> float:
        return units(self.texts, 4)


def _recomputed(jobs: list[_Job], now: float) -> tuple[float, float | None]:
    """What the backlog must say: the work of every untaken sentence of the jobs still
    waiting, and their earliest deadline not passed."""
    waiting = [
        j
        for j in jobs
        if not j.gone and j.taken < len(j.texts) and (j.deadline is None or j.deadline >= now)
    ]
    work = sum(j.work * (len(j.texts) - j.taken) / len(j.texts) for j in waiting)
    deadlines = [j.deadline for j in waiting if j.deadline is not None]
    return work, min(deadlines) if deadlines else None


def test_the_backlog_equals_the_work_recomputed_from_every_job():
    rng = random.Random(0)
    backlog, jobs, now = Backlog(), [], 0.0
    for _ in range(2000):
        action = rng.random()
        now += rng.random() * 0.05
        if action < 0.4 or not jobs:
            texts = ["x" * rng.randint(0, 30) for _ in range(rng.randint(1, 6))]
            job = _Job(texts, None if rng.random() < 0.2 else now + rng.random() * 2)
            jobs.append(job)
            backlog.add(job)
        elif action < 0.8:  # a batch takes some sentences of a job
            job = rng.choice(jobs)
            if not job.gone and job.taken < len(job.texts):
                job.taken += rng.randint(1, len(job.texts) - job.taken)
                backlog.left(job, len(job.texts) - job.taken)
        else:  # a job leaves: answered, cancelled, or dropped
            job = rng.choice(jobs)
            job.gone = True
            backlog.left(job, 0)
        earliest = backlog.earliest(now)
        work, want_earliest = _recomputed(jobs, now)
        assert earliest == want_earliest
        # the sum of floats taken away one by one: within rounding of the total ever added
        assert abs(backlog.work - work) <= 1e-9 * sum(j.work for j in jobs)
    for job in jobs:
        backlog.left(job, 0)
    assert backlog.work == 0.0 and backlog.earliest(now) is None


def test_an_idle_server_admits_and_a_late_total_is_refused():
    estimate, backlog = WorkEstimate(), Backlog()
    new = _Job(["a" * 9], deadline=10.0)
    assert estimate.late(new, backlog, 0.0, 0.0, 0.0) is None  # nothing measured yet
    estimate.measured(work=100.0, seconds=1.0)  # 0.01 s per unit
    assert estimate.late(new, backlog, 0.0, 0.0, 0.0) is None  # nothing ahead of it
    queued = _Job(["a" * 99] * 3, deadline=2.0)  # 300 units x 4 rows: 12 s of work
    backlog.add(queued)
    seconds, earliest = estimate.late(new, backlog, 0.0, 0.0, 0.0)
    assert earliest == 2.0 and abs(seconds - (queued.work + new.work) * 0.01) < 1e-9
