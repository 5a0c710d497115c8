"""`PrecisionArgs`: mixed precision and FP8 (Transformer Engine) settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError
from .policy import fp8_attention_recipe_unsupported

# Default of the small-GEMM policy. A layer runs FP8 only when every dimension of its GEMM(s) is
# >= this. Measured on an H100 (docs/benchmarks.md, FP8 delayed vs BF16 step time):
# 768 wide 0.72-0.80x, 1024 wide (medium) 0.76-0.87x, 1536 wide (yxanul-0.6b, large) 1.16-1.19x,
# 1920 wide 1.24x. So medium and smaller stay BF16; 0 forces FP8 where a faster host wins.
DEFAULT_MIN_GEMM_DIM = 1536


@dataclass
class PrecisionArgs:
    """Precision: BF16/FP32 and FP8 through Transformer Engine."""

    mixed_precision: Literal["auto", "fp32", "bf16"] = field(
        default="auto", metadata={"help": "Non-FP8 precision: auto = bf16 on a CUDA GPU that supports it, else fp32."})
    use_fp8: bool = field(default=False, metadata={"help": "Train the large GEMMs in FP8 with Transformer Engine "
                                                           "(falls back to BF16 with one line saying why when "
                                                           "impossible)."})
    require_fp8: bool = field(default=False, metadata={"help": "Make an impossible FP8 an error instead of a "
                                                               "fallback (implies use_fp8)."})
    fp8_recipe: Literal["delayed", "current", "block", "mxfp8"] = field(
        default="delayed", metadata={"help": "TE recipe: delayed (DelayedScaling), current (Float8CurrentScaling), "
                                             "block (Float8BlockScaling, Hopper+CUDA 12.9), mxfp8 (MXFP8BlockScaling, "
                                             "Blackwell)."})
    fp8_format: Literal["hybrid", "e4m3", "e5m2"] = field(
        default="hybrid", metadata={"help": "hybrid = E4M3 forward, E5M2 gradients; e4m3 everywhere; e5m2 is "
                                            "rejected by every TE recipe ('Pure E5M2 training is not supported')."})
    fp8_margin: int = field(default=0,
                            metadata={"help": "DelayedScaling/MXFP8 margin: scale = fp8_max / amax / 2^margin."})
    fp8_interval: int = field(default=1, metadata={"help": "Recorded for old configs only: TE >= 1.8 has no 'interval' "
                                                           "field (scales update after every step); "
                                                           "!= 1 is warned about."})
    fp8_amax_history_len: int = field(default=1024, metadata={"help": "DelayedScaling amax history length."})
    fp8_amax_compute_algo: Literal["max", "most_recent"] = field(
        default="max", metadata={"help": "DelayedScaling: scale from the max of the amax history "
                                         "or the most recent amax."})
    fp8_eval: bool = field(default=False, metadata={"help": "Run evaluation forwards in FP8 too (default: BF16 eval)."})
    fp8_attention: bool = field(
        default=False, metadata={"help": "Recipes delayed and current: TE's dot-product attention runs in FP8 too "
                                         "(the recipe's fp8_dpa, a TE beta: cuDNN's fused attention casts q/k/v to "
                                         "FP8 and its output back); off, attention stays BF16. Below compute "
                                         "capability 10.0 (H100/H200) it needs fp8_recipe delayed and head_dim 128 "
                                         "(hidden_size / num_attention_heads; cuDNN's FP8 kernel), else refused. "
                                         "Without FP8: no effect, as every fp8_* setting."})
    fp8_min_gemm_dim: int = field(
        default=DEFAULT_MIN_GEMM_DIM,
        metadata={"help": "Small-GEMM policy: a layer runs FP8 only if every dimension of its GEMMs is >= this "
                          "(FP8 casts cost more than they save on small GEMMs). 0 = every eligible layer."})
    fp8_keep_bf16: list[str] | None = field(
        default=None, metadata={"help": "fnmatch patterns of TE module names kept in BF16 whatever their size, e.g. "
                                        "['model.layers.0.*', '*.layers.23.layernorm_mlp'] (a YAML list, or several "
                                        "values after the flag)."})
    master_weights: Literal["none", "fp32"] = field(
        default="none", metadata={"help": "fp32 = the model's weights are BF16 (no per-step autocast weight casts) and "
                                          "the optimizer steps fp32 master copies, gradients accumulated in fp32; "
                                          "checkpoints keep the fp32 masters (needs mixed_precision bf16, one "
                                          "process). none = fp32 weights under autocast (today)."})
    fuse_wgrad_accumulation: bool = field(
        default=False, metadata={"help": "With master_weights fp32 on the TE backend: the wgrad GEMM of every TE "
                                         "weight writes (and accumulates) its fp32 master's gradient itself (TE's "
                                         "fuse_wgrad_accumulation), instead of a BF16 gradient cast to fp32 after "
                                         "it. Needs fuse_qkv_params or fuse_qkv_rope."})
    fp8_weight_all_gather: bool = field(
        default=False, metadata={"help": "Experimental (its losses follow the BF16 all-gather's on a GPU; its "
                                         "resume, fixed since it faulted there, is not yet rerun: "
                                         "docs/distributed.md). "
                                         "FSDP2 with TE FP8 (recipe delayed or current): the decoder layers hold FP8 "
                                         "weights (TE quantized_model_init), so FSDP2 all-gathers 1 byte per weight "
                                         "instead of 2, and TE's FusedAdam keeps the fp32 masters. Needs an FSDP2 "
                                         "profile, fuse_qkv_params, every TE layer in FP8 (fp8_min_gemm_dim 0 below "
                                         "1536 wide), no cuda_graphs; checkpoints resume with the same setting "
                                         "(docs/distributed.md)."})
    fp8_stats: bool = field(default=True,
                            metadata={"help": "Log FP8 scaling statistics every log_freq steps "
                                              "(delayed: scale/amax; all recipes: cached weight scales)."})

    def __post_init__(self):
        for key in ("fp8_margin", "fp8_min_gemm_dim"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(key, "an integer >= 0", v)
        for key in ("fp8_interval", "fp8_amax_history_len"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(key, "an integer >= 1", v)
        if self.fp8_keep_bf16 is not None and (
                not isinstance(self.fp8_keep_bf16,
                               list) or not all(isinstance(p, str) and p for p in self.fp8_keep_bf16)):
            raise ConfigError("fp8_keep_bf16", "a list of non-empty module-name patterns", self.fp8_keep_bf16)
        if self.master_weights not in ("none", "fp32"):
            raise ConfigError("master_weights", "none or fp32", self.master_weights)
        if self.master_weights == "fp32" and self.mixed_precision == "fp32":
            raise ConfigError("master_weights", "none with mixed_precision fp32 (BF16 weights need BF16 compute)",
                              "fp32")
        if self.fuse_wgrad_accumulation and self.master_weights != "fp32":
            raise ConfigError("fuse_wgrad_accumulation", "false without master_weights fp32 (the wgrad GEMMs write "
                                                         "the fp32 masters' gradients)", True)
        if self.require_fp8 and not self.use_fp8:
            self.use_fp8 = True
        if self.use_fp8 and self.mixed_precision == "fp32":  # accelerate's fp8 mode is bf16 autocast + TE
            raise ConfigError("mixed_precision", "auto or bf16 with use_fp8 (accelerate runs every non-FP8 layer "
                                                 "under bf16 autocast)", "fp32")
        if self.fp8_attention and self.use_fp8 and (why := fp8_attention_recipe_unsupported(self.fp8_recipe)):
            raise ConfigError("fp8_attention", f"false {why}", True)
        if self.use_fp8 and self.fp8_format == "e5m2":
            raise ConfigError("fp8_format", "hybrid or e4m3 (TE recipes reject pure E5M2 training)", "e5m2")
