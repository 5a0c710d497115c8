"""Stop signals: SIGTERM/SIGUSR1 (preemption), SIGINT (Ctrl-C) and SIGHUP (a closed terminal or SSH session)
stop every rank on the same step, after a checkpoint (docs/training.md); a second Ctrl-C exits at once."""

from __future__ import annotations

import signal
from typing import Any

import torch


class StopRequest:
    """SIGTERM/SIGUSR1 (SLURM preemption, k8s eviction), SIGINT, SIGHUP: finish the step, checkpoint, exit 0.
    A context manager: ``with StopRequest() as stop:`` installs the handlers and restores the
    previous ones on exit.

    `poll` runs after every optimizer step on every rank. One process: it reads the flag (no device
    work). Several: each rank all-reduces its flag (MAX) on the device and copies the result to
    pinned host memory without blocking; the NEXT poll waits for that copy (finished long before:
    the host runs ahead of the device) and decides from it. So every rank stops on the same step,
    at most one step after the signal, and no step pays a host/device sync."""

    SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGUSR1", None), signal.SIGINT,
                                getattr(signal, "SIGHUP", None)) if s is not None)

    def __init__(self):
        self.signum: int | None = None
        self._pending: tuple[torch.Tensor, Any] | None = None  # (host flag, CUDA event or None)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        """Install the handlers (main thread only; elsewhere, e.g. a test runner thread, none)."""
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc) -> None:
        """Restore the handlers that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait for the save
        self.signum = signum

    def poll(self, accelerator) -> bool:
        """True when the ranks agree to stop now (a collective: call it once per step on every rank)."""
        if accelerator.num_processes == 1:
            return self.signum is not None
        decided = False
        if self._pending is not None:
            host, event = self._pending
            if event is not None:
                event.synchronize()
            decided = bool(host.item() > 0)  # a host tensor: no device sync
        if decided:
            return True
        flag = accelerator.reduce(torch.full((1,), 1.0 if self.signum else 0.0, device=accelerator.device), "max")
        if flag.is_cuda:
            host = self._pending[0] if self._pending else torch.empty(1, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (host, event)
        else:
            self._pending = (flag, None)
        return False
