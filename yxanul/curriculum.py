"""Sequence-length curriculum (seed 000's "ultra-curriculum"): stages of increasing seq_length.

```yaml
target_tokens_per_step: 65536
curriculum:
  - {seq_length: 256,  until_tokens: 200_000_000}
  - {seq_length: 1024, until_steps: 20000}
  - {seq_length: 2048}                  # open-ended last stage
```

Tokens per optimizer step are the same in every stage (each stage gets its own micro-batch and
accumulation from the batch plan), so optimizer steps and tokens are proportional and the LR
schedule — a function of the step — runs continuously over tokens across stages. The stage is a
pure function of the step, so a resumed run lands in the right stage at the right place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Stage:
    seq_length: int
    end_step: int | None  # exclusive; None = open-ended


class Curriculum:
    def __init__(self, stages: list[Stage], tokens_per_step: int):
        self.stages, self.tokens_per_step = stages, tokens_per_step

    @classmethod
    def from_config(cls, stages: list[dict], tokens_per_step: int) -> "Curriculum":
        if not isinstance(stages, list) or not stages:
            raise ConfigError("curriculum", "a non-empty list of {seq_length, until_tokens | until_steps}", stages)
        out, last_end = [], 0
        for i, s in enumerate(stages):
            if not isinstance(s, dict) or set(s) - {"seq_length", "until_tokens", "until_steps"}:
                raise ConfigError("curriculum", f"stage {i}: keys seq_length, until_tokens or until_steps", s)
            T = s.get("seq_length")
            if not isinstance(T, int) or isinstance(T, bool) or T < 2:
                raise ConfigError("curriculum", f"stage {i}: seq_length an integer >= 2", T)
            if "until_tokens" in s and "until_steps" in s:
                raise ConfigError("curriculum", f"stage {i}: until_tokens or until_steps, not both", s)
            if "until_tokens" in s:
                end = math.ceil(float(s["until_tokens"]) / tokens_per_step)
            elif "until_steps" in s:
                end = int(s["until_steps"])
            elif i == len(stages) - 1:
                end = None
            else:
                raise ConfigError("curriculum", f"stage {i}: until_tokens or until_steps (only the last stage "
                                  "may be open-ended)", s)
            if end is not None and end <= last_end:
                raise ConfigError("curriculum", f"stage {i}: boundaries strictly increasing (ends at step {end}, "
                                  f"previous stage ends at step {last_end})", s)
            out.append(Stage(T, end))
            last_end = end if end is not None else last_end
        return cls(out, tokens_per_step)

    def stage_at(self, step: int) -> tuple[int, Stage]:
        """Stage used for optimizer step ``step`` (0-based); past the last boundary: the last stage."""
        for i, s in enumerate(self.stages):
            if s.end_step is None or step < s.end_step:
                return i, s
        return len(self.stages) - 1, self.stages[-1]

    @property
    def max_seq_length(self) -> int:
        return max(s.seq_length for s in self.stages)

    def boundaries(self) -> list[int]:
        return [s.end_step for s in self.stages if s.end_step is not None]
