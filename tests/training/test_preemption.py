"""StopRequest in one process (several: tests/training/test_distributed.py, through `accelerate launch`)."""

import os
import signal

import pytest

from yxanul.training.preemption import StopRequest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs POSIX signals")


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_one_process_stops_on_the_step_after_the_signal(handlers, sig):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    with StopRequest() as stop:
        assert [stop.poll(acc) for _ in range(3)] == [False] * 3  # no signal: never stops
        os.kill(os.getpid(), getattr(signal, sig))  # handled: the process lives on
        assert stop.signum == getattr(signal, sig) and stop.poll(acc)


def test_previous_handlers_are_restored(handlers):
    seen = []

    def previous(signum, frame):
        seen.append(signum)

    signal.signal(signal.SIGUSR1, previous)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with StopRequest() as stop:
        assert signal.getsignal(signal.SIGUSR1) == stop._handle
    assert signal.getsignal(signal.SIGUSR1) is previous and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    os.kill(os.getpid(), signal.SIGUSR1)
    assert seen == [signal.SIGUSR1] and stop.signum is None
