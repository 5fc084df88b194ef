"""A Ctrl-C during process start-up is held back, then delivered to the previous handler."""

import signal

import pytest

from nmt.processes import interrupts_deferred


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
