"""Ctrl-C safety for the child processes that preprocessing forks."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold back a Ctrl-C that arrives while the body runs, and deliver it after.

    Python runs a signal's handler wherever the main thread happens to be. Inside
    os.fork's at-fork hooks, a KeyboardInterrupt is swallowed ("Exception ignored in
    _releaseLock"): the interrupt is lost and the child keeps working unnoticed.
    So wrap the code that starts processes in this; the Ctrl-C then reaches the
    previous handler as soon as the processes exist and can be stopped.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sees Python signal handlers
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)


def ignore_sigint() -> None:
    """In a child: Ctrl-C is the parent's to handle, and the parent stops its children."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
