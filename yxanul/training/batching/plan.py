"""Micro-batch x accumulation x world size toward a target effective batch (exact, or the closest
with a one-line warning stating the deviation)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    micro_batch: int              # sequences per forward/backward per process
    grad_accum: int               # micro-batches per optimizer step
    world_size: int
    seq_length: int
    effective_batch: int          # sequences per optimizer step, all processes
    tokens_per_step: int          # effective_batch x seq_length
    target: int | None = None     # what was asked for, in target_unit
    target_unit: str | None = None  # "sequences" | "tokens"
    deviation: float = 0.0        # (achieved - target) / target; 0 when exact or no target
    warning: str | None = None    # one line when the target can't be met exactly
    note: str | None = None       # one line when the micro-batch had to be lowered a lot to be exact

    @classmethod
    def make(cls, micro_batch: int, grad_accum: int, world_size: int, seq_length: int, **kw) -> BatchPlan:
        eff = micro_batch * grad_accum * world_size
        return cls(micro_batch, grad_accum, world_size, seq_length, eff, eff * seq_length, **kw)

    def line(self) -> str:
        return (f"micro {self.micro_batch} x accumulation {self.grad_accum} x world {self.world_size} = "
                f"{self.effective_batch} sequences x {self.seq_length} = {self.tokens_per_step:,} tokens per "
                f"optimizer step")


def plan_batch(micro_batch: int, world_size: int, seq_length: int, target_effective_batch_size: int | None = None,
               target_tokens_per_step: int | None = None, multiple: int = 1, grad_accum: int = 1) -> BatchPlan:
    """The plan for a micro-batch of at most ``micro_batch`` (what fits; never raised above it).

    With a target (sequences, or tokens per optimizer step) the micro-batch is lowered to the largest
    multiple of ``multiple`` for which micro x accumulation x world hits the target exactly; when no
    such micro-batch exists, the one with the closest product (ties: the larger micro-batch) and a
    warning with the deviation in %. Without a target: ``micro_batch`` x ``grad_accum``.
    """
    for name, v in (("micro_batch", micro_batch), ("world_size", world_size), ("seq_length", seq_length),
                    ("multiple", multiple), ("grad_accum", grad_accum)):
        if v < 1:
            raise ValueError(f"plan_batch: {name} must be >= 1, got {v}")
    if target_effective_batch_size is not None and target_tokens_per_step is not None:
        raise ValueError("plan_batch: target_effective_batch_size or target_tokens_per_step, not both")
    if micro_batch < multiple:
        raise ValueError(f"plan_batch: micro_batch {micro_batch} is below the required multiple {multiple}")
    if target_effective_batch_size is None and target_tokens_per_step is None:
        return BatchPlan.make(micro_batch, grad_accum, world_size, seq_length)
    if target_tokens_per_step is not None:
        target, unit, per_seq = target_tokens_per_step, "tokens", seq_length
    else:
        target, unit, per_seq = target_effective_batch_size, "sequences", 1
    if target < 1:
        raise ValueError(f"plan_batch: target must be >= 1, got {target}")

    best = None  # ((abs error, -micro), micro, accum)
    for micro in range(micro_batch - micro_batch % multiple, 0, -multiple):
        unit_size = micro * world_size * per_seq  # target units per accumulation step
        lo = max(1, target // unit_size)
        for accum in (lo, lo + 1):
            key = (abs(accum * unit_size - target), -micro, accum)
            if best is None or key < best[0]:
                best = (key, micro, accum)
        if best[0][0] == 0:
            break  # descending micro: the first exact one is the largest
    (err, _, _), micro, accum = best
    achieved = micro * accum * world_size * per_seq
    deviation = (achieved - target) / target
    warning = note = None
    if err:
        warning = (f"batch target {target:,} {unit} per optimizer step can't be met exactly with micro-batches "
                   f"<= {micro_batch}" + (f" (multiples of {multiple})" if multiple > 1 else "")
                   + f" x world {world_size}" + (f" x seq_length {seq_length}" if unit == "tokens" else "")
                   + f": using {achieved:,} ({deviation:+.2%})")
    elif micro * 2 <= micro_batch:
        note = (f"micro-batch lowered from {micro_batch} to {micro} so that {micro} x {accum} x {world_size} "
                f"hits the target {target:,} {unit} exactly; a target with more factors of 2 would keep it larger")
    return BatchPlan.make(micro, accum, world_size, seq_length, target=target, target_unit=unit,
                          deviation=deviation, warning=warning, note=note)
