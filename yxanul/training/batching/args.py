"""`BatchArgs`: micro-batch, accumulation, targets, the adaptive search and the curriculum."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...errors import ConfigError

# TE's FP8 GEMMs need the token dimension of every FP8 Linear input (micro-batch x seq_length)
# to be a multiple of 16 (and the feature dims multiples of 16, which the presets guarantee).
FP8_TOKEN_ALIGN = 16


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class BatchArgs:
    """Micro-batch, accumulation and the effective batch."""

    micro_batch_size: int = field(default=8, metadata={
        "help": "Sequences per forward/backward on each process (with auto_batch_size: the fallback where "
                "nothing can run out of memory, i.e. on CPU)."})
    gradient_accumulation_steps: int = field(default=1, metadata={
        "help": "Micro-batches per optimizer step (derived instead when a target is set)."})
    auto_batch_size: bool = field(default=False, metadata={
        "help": "Probe the largest micro-batch that fits with real training steps (GPU), then derive "
                "accumulation from the target; results are cached (docs/batching.md)."})
    target_effective_batch_size: int | None = field(default=None, metadata={
        "help": "Sequences per optimizer step across all processes (sets accumulation)."})
    target_tokens_per_step: int | None = field(default=None, metadata={
        "help": "Tokens per optimizer step across all processes (sets accumulation; constant across "
                "curriculum stages)."})
    max_micro_batch_size: int = field(default=1024, metadata={"help": "Upper bound of the micro-batch search."})
    batch_safety_margin: float = field(default=0.9, metadata={
        "help": "Use this fraction of the largest micro-batch that fit (applied only when an OOM was seen)."})
    micro_batch_multiple: int = field(default=1, metadata={
        "help": "Micro-batches are multiples of this. With FP8 the multiple that makes micro x seq_length a "
                "multiple of 16 is added automatically."})
    curriculum: list[dict] | None = field(default=None, metadata={
        "help": "YAML only: sequence-length stages [{seq_length, until_tokens | until_steps}, ...]; the last "
                "stage may be open-ended."})

    def __post_init__(self):
        for key in ("micro_batch_size", "gradient_accumulation_steps", "max_micro_batch_size", "micro_batch_multiple"):
            v = getattr(self, key)
            if not _is_int(v) or v < 1:
                raise ConfigError(key, "an integer >= 1", v)
        for key in ("target_effective_batch_size", "target_tokens_per_step"):
            v = getattr(self, key)
            if v is not None and (not _is_int(v) or v < 1):
                raise ConfigError(key, "a positive integer or null", v)
        if self.target_effective_batch_size is not None and self.target_tokens_per_step is not None:
            raise ConfigError("target_tokens_per_step", "null when target_effective_batch_size is set (one target "
                              "only)", self.target_tokens_per_step)
        if isinstance(self.batch_safety_margin, bool) or not isinstance(self.batch_safety_margin, (int, float)) \
                or not 0.1 <= self.batch_safety_margin <= 1.0:
            raise ConfigError("batch_safety_margin", "a number in [0.1, 1]", self.batch_safety_margin)
        if self.max_micro_batch_size < self.micro_batch_multiple:
            raise ConfigError("max_micro_batch_size", f">= micro_batch_multiple={self.micro_batch_multiple}",
                              self.max_micro_batch_size)
        if self.curriculum is not None and not (isinstance(self.curriculum, list) and self.curriculum):
            raise ConfigError("curriculum", "a non-empty list of {seq_length, until_tokens | until_steps}",
                              self.curriculum)

    @property
    def target(self) -> bool:
        return self.target_effective_batch_size is not None or self.target_tokens_per_step is not None


def fp8_micro_multiple(seq_length: int, align: int = FP8_TOKEN_ALIGN) -> int:
    """Smallest m such that any multiple of m times ``seq_length`` is a multiple of ``align``
    (1 for the usual seq lengths that are multiples of 16; 16 for an odd seq_length)."""
    return align // math.gcd(seq_length, align)


def micro_multiple(args: BatchArgs, seq_length: int, token_align: int = 1) -> int:
    """The multiple every micro-batch must have: ``micro_batch_multiple``, and the FP8 token alignment
    (``PrecisionPlan.token_alignment``: 1 without FP8, 16, or 32 for MXFP8)."""
    m, a = args.micro_batch_multiple, fp8_micro_multiple(seq_length, token_align)
    return m * a // math.gcd(m, a)
