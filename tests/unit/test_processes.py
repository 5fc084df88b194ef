"""A Ctrl-C or SIGTERM during process start-up is held back, then delivered to the previous
handler; SIGTERM can raise like Ctrl-C; a child dies with its parent, even one killed -9."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nmt.processes import Terminated, interrupts_deferred, sigterm_raises


def test_a_ctrl_c_inside_is_delivered_after_the_block() -> None:
    finished_block = False
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)  # e.g. while os.fork runs its at-fork hooks
            finished_block = True
    assert finished_block
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_nothing_is_raised() -> None:
    with interrupts_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_custom_handler_gets_the_held_ctrl_c() -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            assert calls == []
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_sigterm_raises_terminated_held_back_while_deferred() -> None:
    with sigterm_raises():
        finished_block = False
        with pytest.raises(Terminated) as err:
            with interrupts_deferred():
                signal.raise_signal(signal.SIGTERM)
                finished_block = True
        assert finished_block and err.value.signum == signal.SIGTERM
        assert str(err.value) == "terminated by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


FAMILY = textwrap.dedent("""
    import os, sys, time
    import nmt.processes as processes
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        if sys.argv[1] == "watch":  # as where there is no PR_SET_PDEATHSIG
            processes._kill_me_when_parent_dies = lambda: False
        processes.become_child_of(parent)
        time.sleep(120)
        os._exit(0)
    print(child, flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["prctl", "watch"])
def test_a_child_dies_with_its_parent_killed_by_kill_9(how: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", FAMILY, how], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        time.sleep(0.5)  # the child has asked to die with its parent
        assert _alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10  # the watcher looks once a second
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()
        parent.wait()
        if _alive(child):
            os.kill(child, signal.SIGKILL)
