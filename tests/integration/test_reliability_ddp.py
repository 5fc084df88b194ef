"""Reliability (issue 7), torchrun: a rank that raises (rather than dies, which test_ddp.py
covers) ends with its own one-line error, and the other rank stops within a bounded time
with a one-line error naming its rank, never a hang. Two real gloo processes: slow."""

from __future__ import annotations

import time

import pytest
from helpers import rendezvous_store
from test_ddp import start_ranks_with_a_faulty_rank_1


@pytest.mark.slow
def test_a_rank_that_raises_stops_the_other_within_the_timeout(demo_data_dir, tmp_path):
    with rendezvous_store() as port:
        procs = start_ranks_with_a_faulty_rank_1(
            demo_data_dir,
            tmp_path,
            port,
            'raise NmtError("update 3: injected failure on rank 1")',
            imports="from nmt.errors import NmtError",
        )
        try:
            out1 = procs[1].communicate(timeout=120)
            failed_at = time.monotonic()
            out0 = procs[0].communicate(timeout=60)  # distributed.timeout=20 bounds the wait
            waited = time.monotonic() - failed_at
        finally:
            for p in procs:
                p.kill()
    assert procs[1].returncode == 2
    assert (
        out1[1].strip().splitlines()[-1] == "nmt-train: error: update 3: injected failure on rank 1"
    )
    assert procs[0].returncode == 2, out0[1][-2000:]
    last = out0[1].strip().splitlines()[-1]
    assert last.startswith("nmt-train: error: rank 0/2: lost contact with the other ranks"), last
    assert "Traceback" not in out0[1] + out1[1]
    assert waited < 50
