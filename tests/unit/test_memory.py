"""nmt.memory.keep_freed_memory: freed big blocks stay mapped, so reusing them costs no
page faults (measured in a fresh process, as the setting is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
from nmt.memory import keep_freed_memory
torch.set_num_threads(1)
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
def step():  # a training step's biggest tensors: logits and log-probs, 131 MB each
    logits = torch.empty(4096, 8000)
    logits.fill_(1.0)
    return torch.log_softmax(logits, -1).sum()
for _ in range(3):  # the heap grows to its working size
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_big_tensors_are_reused_without_page_faults():
    default, tuned = _page_faults("default"), _page_faults("tuned")
    assert default > 5 * 60000  # both blocks faulted in again every step: 2 x 32k pages
    assert tuned < default / 10  # once grown, the heap serves them again
