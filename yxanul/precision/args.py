"""`PrecisionArgs`: mixed precision and FP8 (Transformer Engine) settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError


@dataclass
class PrecisionArgs:
    """Precision: BF16/FP32 and FP8 through Transformer Engine."""

    mixed_precision: Literal["auto", "fp32", "bf16"] = field(
        default="auto", metadata={"help": "Non-FP8 precision: auto = bf16 on a CUDA GPU that supports it, else fp32."})
    use_fp8: bool = field(default=False, metadata={"help": "Train the large GEMMs in FP8 with Transformer Engine "
                                                           "(falls back to BF16 with one line saying why when impossible)."})
    require_fp8: bool = field(default=False, metadata={"help": "Make an impossible FP8 an error instead of a fallback."})
    fp8_recipe: Literal["delayed", "current", "block", "mxfp8"] = field(
        default="delayed", metadata={"help": "TE recipe: delayed (DelayedScaling), current (Float8CurrentScaling), "
                                             "block (Float8BlockScaling), mxfp8 (MXFP8BlockScaling, Blackwell)."})
    fp8_format: Literal["hybrid", "e4m3", "e5m2"] = field(
        default="hybrid", metadata={"help": "hybrid = E4M3 forward, E5M2 gradients; e4m3 everywhere; e5m2 (TE "
                                            "rejects pure E5M2 for forward tensors in most recipes)."})
    fp8_margin: int = field(default=0, metadata={"help": "DelayedScaling margin: scale = 2^-margin x max/amax."})
    fp8_interval: int = field(default=1, metadata={"help": "Recorded for compatibility: TE >= 1.8 has no 'interval' "
                                                           "(scales update every step); values != 1 are warned about."})
    fp8_amax_history_len: int = field(default=1024, metadata={"help": "DelayedScaling amax history length."})
    fp8_amax_compute_algo: Literal["max", "most_recent"] = field(
        default="max", metadata={"help": "DelayedScaling: scale from the max of the history or the most recent amax."})
    fp8_eval: bool = field(default=False, metadata={"help": "Run evaluation in FP8 too (default: BF16 eval)."})
    fp8_min_gemm_dim: int = field(
        default=1024, metadata={"help": "Small-GEMM policy: a layer runs FP8 only if both of its weight dims are >= "
                                        "this (FP8 casts cost more than they save on small GEMMs). 0 = every layer."})
    fp8_stats: bool = field(default=True, metadata={"help": "Log FP8 scaling statistics every log_freq steps."})

    def __post_init__(self):
        if self.fp8_margin < 0:
            raise ConfigError("fp8_margin", "an integer >= 0", self.fp8_margin)
        if self.fp8_interval < 1:
            raise ConfigError("fp8_interval", "an integer >= 1", self.fp8_interval)
        if self.fp8_amax_history_len < 1:
            raise ConfigError("fp8_amax_history_len", "an integer >= 1", self.fp8_amax_history_len)
        if self.fp8_min_gemm_dim < 0:
            raise ConfigError("fp8_min_gemm_dim", "an integer >= 0", self.fp8_min_gemm_dim)
        if self.require_fp8 and not self.use_fp8:
            self.use_fp8 = True
