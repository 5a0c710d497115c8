"""The micro-batch search: exponential growth until an out-of-memory error, then a binary search
between the last success and the first failure, on multiples of ``multiple``.

Probes: ``1 + ceil(log2(max/multiple))`` at most while growing, as many again while bisecting, so at
most about ``2·log2(max)`` (tested: <= 2*ceil(log2(max/multiple)) + 1 for every boundary).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import UserError


class NoFitError(UserError):
    """Even the smallest micro-batch runs out of memory."""


def default_is_oom(e: BaseException) -> bool:
    """accelerate's own test (CUDA/XPU/MPS/CPU allocator messages, cuDNN's), plus the typed CUDA error."""
    from accelerate.utils.memory import should_reduce_batch_size

    try:
        import torch

        if isinstance(e, torch.cuda.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover
        pass
    return should_reduce_batch_size(e)


def free_memory() -> None:
    """gc + the device allocator's cache (accelerate's ``release_memory`` does both)."""
    from accelerate.utils.memory import release_memory

    release_memory()


@dataclass
class SearchResult:
    micro_batch: int                 # what to use: largest_ok with the safety margin when an OOM was seen
    largest_ok: int                  # largest size that ran
    smallest_fail: int | None        # smallest size that ran out of memory (None: the cap was reached)
    probes: list[tuple[int, bool, float]] = field(default_factory=list)  # (size, ok, seconds), in order

    @property
    def seconds(self) -> float:
        return sum(p[2] for p in self.probes)

    def to_dict(self) -> dict:
        return {"micro_batch": self.micro_batch, "largest_ok": self.largest_ok, "smallest_fail": self.smallest_fail,
                "probes": [list(p) for p in self.probes]}

    @classmethod
    def from_dict(cls, d: dict) -> SearchResult:
        return cls(int(d["micro_batch"]), int(d["largest_ok"]),
                   None if d.get("smallest_fail") is None else int(d["smallest_fail"]),
                   [(int(b), bool(ok), float(s)) for b, ok, s in d.get("probes", [])])


def apply_margin(largest_ok: int, smallest_fail: int | None, safety_margin: float, multiple: int = 1) -> int:
    """``safety_margin`` x ``largest_ok`` rounded down to ``multiple`` (at least ``multiple``), only when
    an OOM bounded the search: a cap that was reached without OOM is not a memory boundary."""
    if smallest_fail is None:
        return largest_ok
    return max(multiple, min(largest_ok, int(largest_ok * safety_margin) // multiple * multiple))


def find_micro_batch(probe: Callable[[int], None], *, start: int = 1, max_size: int, multiple: int = 1,
                     safety_margin: float = 0.9, is_oom: Callable[[BaseException], bool] = default_is_oom,
                     on_probe: Callable[[int, bool, float], None] | None = None,
                     reduce_min: Callable[[int], int] | None = None,
                     free: Callable[[], None] | None = free_memory) -> SearchResult:
    """Largest micro-batch (a multiple of ``multiple``, <= ``max_size``) for which ``probe(size)``
    doesn't raise an out-of-memory error.

    ``probe(size)`` runs the workload (e.g. a :class:`~yxanul.batching.probe.TrainingProbe`); an
    exception for which ``is_oom`` is true counts as "doesn't fit", any other exception propagates.
    ``free()`` runs after every probe. ``on_probe(size, ok, seconds)`` is called after each probe (live output).
    ``reduce_min(x) -> min of x over all ranks`` makes every rank take the same path (a size fits only
    if it fit everywhere): pass e.g. ``lambda x: int(accelerator.reduce(torch.tensor(x, device=d), "min"))``
    (accelerate has no "min" reduction: use :func:`torch_reduce_min`). Every rank must call this.
    """
    if multiple < 1 or max_size < multiple:
        raise ValueError(f"find_micro_batch: need 1 <= multiple <= max_size, got multiple={multiple}, "
                         f"max_size={max_size}")
    prober = _Prober(probe, multiple, is_oom, on_probe, reduce_min, free)
    kmax = max_size // multiple
    lo, hi = _grow(prober, min(max(1, -(-start // multiple)), kmax), kmax)
    lo, hi = _bisect(prober, lo, hi)
    if lo == 0:
        raise NoFitError(f"even a micro-batch of {multiple} runs out of memory: enable gradient_checkpointing, "
                         "lower seq_length or use a smaller model")
    largest, fail = lo * multiple, (None if hi is None else hi * multiple)
    return SearchResult(apply_margin(largest, fail, safety_margin, multiple), largest, fail, prober.probes)


class _Prober:
    """One probe of ``k`` x ``multiple`` sequences: OOM = doesn't fit, memory freed, agreed over ranks,
    recorded in ``probes`` as (size, ok, seconds) and passed to ``on_probe``."""

    def __init__(self, probe, multiple, is_oom, on_probe, reduce_min, free):
        self.probe, self.multiple, self.is_oom = probe, multiple, is_oom
        self.on_probe, self.reduce_min, self.free = on_probe, reduce_min, free
        self.probes: list[tuple[int, bool, float]] = []

    def fits(self, k: int) -> bool:
        size = k * self.multiple
        t = time.perf_counter()
        ok = True
        try:
            self.probe(size)
        except Exception as e:  # noqa: BLE001 - only OOMs are swallowed
            if not self.is_oom(e):
                raise
            ok = False
        finally:
            if self.free is not None:
                self.free()
        if self.reduce_min is not None:
            ok = bool(self.reduce_min(int(ok)))
        dt = time.perf_counter() - t
        self.probes.append((size, ok, dt))
        if self.on_probe is not None:
            self.on_probe(size, ok, dt)
        return ok


def _grow(prober: _Prober, k: int, kmax: int) -> tuple[int, int | None]:
    """Double from ``k`` until a size doesn't fit or ``kmax`` fits: (lo, hi) in units of ``multiple``,
    lo the largest that fit (0: none), hi the first that didn't (None: none)."""
    lo = 0
    while True:
        if not prober.fits(k):
            return lo, k
        lo = k
        if k == kmax:
            return lo, None
        k = min(kmax, 2 * k)


def _bisect(prober: _Prober, lo: int, hi: int | None) -> tuple[int, int | None]:
    """Between a size that fit (``lo``) and one that didn't (``hi``), down to neighbours."""
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if prober.fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def torch_reduce_min(device=None) -> Callable[[int], int]:
    """``reduce_min`` over the default torch.distributed process group (identity when not initialised)."""
    import torch
    import torch.distributed as dist

    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"

    def reduce(x: int) -> int:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return x
        t = torch.tensor([x], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    return reduce
