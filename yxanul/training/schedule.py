"""The schedule of a run, as pure functions of the optimizer step: the learning rate (linear warmup,
then cosine decay to ``min_lr_ratio * max_lr``) and the sequence-length curriculum.

The trainer sets each step's LR from :func:`lr_at` itself instead of preparing a torch scheduler
with accelerate: ``AcceleratedScheduler`` steps ``num_processes`` times per call (unless
``split_batches``), which would tie the schedule to the world size; a pure function of the
optimizer step also makes resume trivially exact.

Curriculum: stages of (usually increasing) seq_length at constant tokens per step.

```yaml
target_tokens_per_step: 65536
curriculum:
  - {seq_length: 256,  until_tokens: 200_000_000}
  - {seq_length: 1024, until_steps: 20000}
  - {seq_length: 2048}                  # open-ended last stage
```

Tokens per optimizer step are the same in every stage (each stage gets its own micro-batch and
accumulation from :func:`yxanul.training.batching.plan_batch` with ``target_tokens_per_step``, i.e.
``tokens_per_step / seq_length`` sequences per step). Hence ``tokens_seen = step x tokens_per_step``
exactly: the LR schedule, a function of the optimizer step (:func:`lr_at`), runs
continuously over tokens across stages (``lr_at(tokens_seen // tokens_per_step)``). Boundaries are stored as optimizer
steps (``until_tokens`` rounds up to the first whole step at or past it), and the stage is a pure
function of the step (or of the tokens seen), so a resumed run lands in the right stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from ..flags import whole_number
from .batching import plan_batch


def lr_at(step: int, *, max_lr: float, min_lr_ratio: float, warmup_steps: int, decay_steps: int) -> float:
    """Learning rate used for optimizer step ``step`` (0-based: the first update uses ``lr_at(0)``).

    Linear warmup reaches ``max_lr`` at ``step == warmup_steps``; cosine decay reaches
    ``min_lr_ratio * max_lr`` at ``step == decay_steps`` and stays there.
    """
    min_lr = max_lr * min_lr_ratio
    if warmup_steps > 0 and step < warmup_steps:
        return max_lr * (step + 1) / (warmup_steps + 1)
    if step >= decay_steps:
        return min_lr
    span = max(1, decay_steps - warmup_steps)
    progress = (step - warmup_steps) / span
    return max_lr - 0.5 * (1.0 - math.cos(math.pi * progress)) * (max_lr - min_lr)



def schedule_of(flat: dict) -> dict:
    """:func:`lr_at`'s keyword arguments from a flat config (``Config.to_flat_dict()``, or the ``config.yaml`` a
    checkpoint was written with): ``decay_steps`` is ``lr_decay_steps``, else ``max_steps``."""
    return {"max_lr": flat["max_lr"], "min_lr_ratio": flat["min_lr_ratio"], "warmup_steps": flat["warmup_steps"],
            "decay_steps": flat.get("lr_decay_steps") or flat["max_steps"]}


def warmup_steps_for_tokens(warmup_tokens: int, tokens_per_step: int) -> int:
    """Optimizer steps of a warmup given in tokens: the first whole step at or past ``warmup_tokens``
    (rounded up, like a curriculum's ``until_tokens``): 100,000,000 tokens at 131,072 per step = 763 steps
    (762.94 rounded up). Tokens per step are the same in every curriculum stage, so this is exact for
    the whole run."""
    if isinstance(warmup_tokens, bool) or not isinstance(warmup_tokens, int) or warmup_tokens < 0:
        raise ConfigError("warmup_tokens", "an integer >= 0 or null", warmup_tokens)
    if isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, int) or tokens_per_step < 1:
        raise ValueError(f"warmup_steps_for_tokens: tokens_per_step must be a positive integer, got {tokens_per_step}")
    return -(-warmup_tokens // tokens_per_step)


_KEYS = {"seq_length", "until_tokens", "until_steps"}


@dataclass(frozen=True)
class Stage:
    seq_length: int
    end_step: int | None     # exclusive: the first optimizer step of the next stage; None = open-ended
    start_step: int = 0
    tokens_per_step: int = 0

    @property
    def end_tokens(self) -> int | None:
        return None if self.end_step is None else self.end_step * self.tokens_per_step

    @property
    def sequences_per_step(self) -> int:
        return self.tokens_per_step // self.seq_length


class Curriculum:
    def __init__(self, stages: list[Stage], tokens_per_step: int):
        self.stages, self.tokens_per_step = stages, tokens_per_step

    @classmethod
    def from_config(cls, stages: list[dict], tokens_per_step: int, max_seq_length: int | None = None) -> Curriculum:
        """Validate ``[{seq_length, until_tokens | until_steps}, ...]`` for ``tokens_per_step`` tokens per
        optimizer step (every stage's seq_length must divide it so the step holds whole sequences)."""
        if isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, int) or tokens_per_step < 1:
            raise ConfigError("target_tokens_per_step", "a positive integer (tokens per optimizer step)",
                              tokens_per_step)
        if not isinstance(stages, list) or not stages:
            raise ConfigError("curriculum", "a non-empty list of {seq_length, until_tokens | until_steps}", stages)
        out: list[Stage] = []
        start = 0
        for i, s in enumerate(stages):
            if not isinstance(s, dict) or not s.keys() <= _KEYS:
                raise ConfigError("curriculum", f"stage {i}: a mapping with keys seq_length and until_tokens or "
                                  "until_steps", s)
            T = whole_number(s.get("seq_length"))
            if T is None or T < 2:
                raise ConfigError("curriculum", f"stage {i}: seq_length an integer >= 2", s.get("seq_length"))
            if max_seq_length is not None and T > max_seq_length:
                raise ConfigError("curriculum", f"stage {i}: seq_length <= the model's {max_seq_length} "
                                  "(set seq_length to the longest stage)", T)
            if tokens_per_step % T:
                lcm = math.lcm(*(whole_number(x.get("seq_length")) or 1 for x in stages if isinstance(x, dict)))
                raise ConfigError("curriculum", f"stage {i}: seq_length dividing the {tokens_per_step:,} tokens per "
                                  f"optimizer step (make target_tokens_per_step a multiple of {lcm})", T)
            if "until_tokens" in s and "until_steps" in s:
                raise ConfigError("curriculum", f"stage {i}: until_tokens or until_steps, not both", s)
            if "until_tokens" in s or "until_steps" in s:
                key = "until_tokens" if "until_tokens" in s else "until_steps"
                v = whole_number(s[key])
                if v is None or v < 1:
                    raise ConfigError("curriculum", f"stage {i}: {key} a positive integer", s[key])
                end = -(-v // tokens_per_step) if key == "until_tokens" else v
            elif i == len(stages) - 1:
                end = None
            else:
                raise ConfigError("curriculum", f"stage {i}: until_tokens or until_steps (only the last stage may be "
                                  "open-ended)", s)
            if end is not None and end <= start:
                raise ConfigError("curriculum", f"stage {i}: boundaries strictly increasing (ends at step {end}, the "
                                  f"previous stage at step {start})", s)
            out.append(Stage(T, end, start, tokens_per_step))
            start = end if end is not None else start
        return cls(out, tokens_per_step)

    def stage_at(self, step: int | None = None, *, tokens_seen: int | None = None) -> tuple[int, Stage]:
        """``(index, stage)`` for optimizer step ``step`` (0-based) or, equivalently, after
        ``tokens_seen`` tokens (= step x tokens_per_step). Past the last boundary: the last stage."""
        if (step is None) == (tokens_seen is None):
            raise TypeError("stage_at: pass step or tokens_seen")
        if step is None:
            step = tokens_seen // self.tokens_per_step
        for i, s in enumerate(self.stages):
            if s.end_step is None or step < s.end_step:
                return i, s
        return len(self.stages) - 1, self.stages[-1]

    @property
    def max_seq_length(self) -> int:
        return max(s.seq_length for s in self.stages)

    def grid_warnings(self, base_length: int) -> list[str]:
        """One line per stage whose seq_length does not divide ``base_length`` (the run's seq_length): the loader
        reads such a stage on its own window grid (data.md, Curriculum), so entering or leaving it starts the next
        epoch, the rest of the current one unread. Said at start: the loss of data shows nowhere else."""
        lines = []
        for i, st in enumerate(self.stages):
            T = st.seq_length
            if base_length % T == 0 or len(self.stages) == 1:
                continue
            lo = max((d for d in range(2, T) if base_length % d == 0), default=None)
            hi = min(d for d in range(T + 1, base_length + 1) if base_length % d == 0)
            change = " or ".join(w for w, at in (("into", i > 0), ("out of", i < len(self.stages) - 1)) if at)
            lines.append(f"warning: curriculum stage {i}: seq_length {T} does not divide the run's seq_length "
                         f"{base_length}: the stage change {change} it starts the next epoch (the rest of the "
                         f"current one is not read); stage lengths dividing {base_length} share one pass (e.g. "
                         + (f"{lo} or {hi})" if lo else f"{hi})"))
        return lines

    def reach_warnings(self, max_steps: int) -> list[str]:
        """One line per stage that starts at or after ``max_steps``: the run ends before it, so its seq_length is
        never trained (a boundary in steps of another schedule, or until_tokens of a larger batch)."""
        return [f"warning: curriculum stage {i} (seq_length {st.seq_length}) starts at step {st.start_step + 1}, "
                f"after max_steps {max_steps}: it never runs (end the stages before it earlier, or raise max_steps)"
                for i, st in enumerate(self.stages) if i > 0 and st.start_step >= max_steps]

    def plan_stages(self, micro_for: Callable[[int], int], world_size: int,
                    multiple: Callable[[int], int] | int = 1) -> list:
        """One :class:`~yxanul.training.batching.BatchPlan` per stage with the same tokens per optimizer step:
        ``micro_for(seq_length)`` is the largest micro-batch that fits at that length (the finder's
        result, or :func:`same_tokens_micro`), ``multiple`` the micro-batch multiple (or a function of
        the seq_length, e.g. for FP8)."""
        plans = []
        for s in self.stages:
            m = multiple(s.seq_length) if callable(multiple) else multiple
            plans.append(plan_batch(max(m, micro_for(s.seq_length)), world_size, s.seq_length,
                                    target_tokens_per_step=self.tokens_per_step, multiple=m))
        return plans


def same_tokens_micro(base_micro: int, base_seq_length: int) -> Callable[[int], int]:
    """``micro_for`` keeping the tokens per micro-batch of a base plan (what fits at the base length
    roughly fits at a shorter one; attention memory grows faster, so probe longer stages instead)."""
    return lambda seq_length: max(1, base_micro * base_seq_length // seq_length)

