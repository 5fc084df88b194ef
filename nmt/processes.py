"""Signal safety for the child processes that preprocessing forks.

Three rules, whatever stops the run:
- Ctrl-C (SIGINT) and SIGTERM are the parent's to handle: it stops its children and
  removes what it was writing. `sigterm_raises` turns SIGTERM into `Terminated`, an
  exception like KeyboardInterrupt, so that the same cleanup runs for both.
- A signal that arrives while a child is being forked is held back and delivered right
  after (`interrupts_deferred`): inside os.fork's at-fork hooks Python swallows the
  exception, and the run would go on unnoticed.
- A child never outlives its parent, even one killed by kill -9 (no cleanup runs then):
  `become_child_of` asks the kernel to SIGKILL the child when the parent dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """In the block, SIGTERM raises `Terminated` (a BaseException) in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sees Python signal handlers
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back a SIGINT or SIGTERM that arrives while the body runs, and deliver it after.

    Python runs a signal's handler wherever the main thread happens to be. Inside
    os.fork's at-fork hooks, a KeyboardInterrupt is swallowed ("Exception ignored in
    _releaseLock"): the interrupt is lost and the child keeps working unnoticed. So wrap
    the code that starts processes in this (and any few steps that must not be cut in
    two); the signal then reaches the previous handler as soon as the block is done.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sees Python signal handlers
        return
    received: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, frame: received.append(signum))
        for signum in STOP_SIGNALS
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for held in dict.fromkeys(received):
            signal.raise_signal(held)


def become_child_of(parent_pid: int) -> None:
    """First thing in a forked child: leave Ctrl-C to the parent, die at SIGTERM without
    Python's cleanup (the parent's handlers were inherited), and die with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not _kill_me_when_parent_dies():
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _kill_me_when_parent_dies() -> bool:
    return signal_when_parent_dies(signal.SIGKILL)


def signal_when_parent_dies(signum: int) -> bool:
    """Linux's PR_SET_PDEATHSIG: the kernel sends `signum` to this process when its parent
    exits. False where the kernel offers no such request."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0


def _watch_parent(parent_pid: int) -> None:
    """Elsewhere: look once a second whether the parent is gone (we were re-parented)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)
