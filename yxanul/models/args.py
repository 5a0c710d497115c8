"""`ModelArgs`: which model the trainer builds (torch-free; building it: build.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError
from ..flags import did_you_mean
from .presets import BACKENDS, PRESETS

PENALTY_TYPES = ("none", "z_loss", "max_z_loss")
LOSS_IMPLS = ("default", "chunked", "te")
NORM_KERNELS = ("te", "cudnn")


def validate_loss(penalty_type, penalty_weight, loss_impl) -> None:
    """One-line ConfigError for a bad penalty/loss setting (ModelArgs and YxanulConfig share it; no torch)."""
    if penalty_type not in PENALTY_TYPES:
        raise ConfigError("penalty_type", "one of " + ", ".join(PENALTY_TYPES), penalty_type)
    if (isinstance(penalty_weight, bool) or not isinstance(penalty_weight, (int, float))
            or not math.isfinite(penalty_weight) or penalty_weight < 0):
        raise ConfigError("penalty_weight", "a number >= 0", penalty_weight)
    if loss_impl not in LOSS_IMPLS:
        raise ConfigError("loss_impl", "one of " + ", ".join(LOSS_IMPLS), loss_impl)



@dataclass
class ModelArgs:
    """Model architecture and backend."""

    model: str = field(default="nano", metadata={"help": "Preset: " + ", ".join(PRESETS) + " (docs/models.md)."})
    backend: Literal["auto", "te", "torch"] = field(
        default="auto", metadata={"help": "Layer implementation: te (Transformer Engine), torch, or auto "
                                          "(te when it imports and a CUDA GPU is present, else torch)."})
    seq_length: int = field(default=256, metadata={"help": "Tokens per training sequence."})
    tie_word_embeddings: bool | None = field(
        default=None, metadata={"help": "Share the LM head with the input embedding (unset: the preset's "
                                        "default, tied)."})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in backward to save memory (slower)."})
    penalty_type: Literal["none", "z_loss", "max_z_loss"] = field(
        default="none", metadata={"help": "Penalty added to the training loss: "
                                          "z_loss = weight*mean(logsumexp(logits)^2) "
                                          "(PaLM/OLMo), max_z_loss = weight*mean(max logit^2) (Baichuan 2); "
                                          "docs/models.md. Validation uses the LM loss only."})
    penalty_weight: float = field(default=0.0, metadata={"help": "Weight (lambda >= 0) of penalty_type."})
    loss_impl: Literal["default", "chunked", "te"] = field(
        default="default", metadata={"help": "Cross entropy: default (fp32 (B,T,V) logits), chunked (linear + CE over "
                                             "token chunks, no (B,T,V) logits), te (Transformer Engine's "
                                             "parallel_cross_entropy on BF16 logits; CUDA + TE)."})
    fuse_qkv_params: bool = field(
        default=False, metadata={"help": "TE backend: one fused QKV weight instead of three (fewer per-step weight "
                                         "casts); checkpoints keep q/k/v names. Ignored by the torch backend."})
    fuse_qkv_rope: bool = field(
        default=False, metadata={"help": "TE backend: one fused QKV weight (implies fuse_qkv_params) whose q/k "
                                         "rotation and q/k/v split run as ONE TE kernel per layer and direction "
                                         "instead of TE's split + two RoPE launches; checkpoints keep q/k/v names. "
                                         "Not under FSDP2 or DeepSpeed. Ignored by the torch backend."})
    rope_kernel: Literal["te", "triton"] = field(
        default="te", metadata={"help": "The kernel of fuse_qkv_rope: te (Transformer Engine's fused QKV RoPE) or "
                                        "triton (yxanul's, models/rope_triton.py: the same split and rotation with "
                                        "vector loads; needs triton, which CUDA builds of torch install)."})
    norm_kernel: Literal["te", "cudnn"] = field(
        default="te", metadata={"help": "TE backend: the RMSNorm kernels, te (Transformer Engine's: tuned for hidden "
                                        "512/768/1024/2048/4096/8192, a slower general kernel otherwise, e.g. "
                                        "xlarge's 1920) or cudnn (cuDNN's, TE's NVTE_NORM_{FWD,BWD}_USE_CUDNN); "
                                        "one choice per process. Ignored by the torch backend."})
    cuda_graphs: bool = field(
        default=False, metadata={"help": "TE backend on CUDA: capture each decoder block as a CUDA graph (TE's "
                                         "make_graphed_callables, FP8-aware) on the first step; needs a fixed "
                                         "micro_batch_size and seq_length (no curriculum, no batch finder)."})
    init_from: str | None = field(
        default=None, metadata={"help": "Initialise the weights from a save_pretrained folder or a checkpoint "
                                        "folder (model*.safetensors) of the same preset; optimizer, step and data "
                                        "start fresh (use --resume to continue a run)."})
    def __post_init__(self):
        if self.model not in PRESETS:
            raise ConfigError("model", "one of " + ", ".join(PRESETS) + did_you_mean(self.model, PRESETS), self.model)
        if self.backend not in BACKENDS:
            raise ConfigError("backend", "one of " + ", ".join(BACKENDS), self.backend)
        if isinstance(self.seq_length, bool) or not isinstance(self.seq_length, int) or self.seq_length < 2:
            raise ConfigError("seq_length", "an integer >= 2", self.seq_length)
        if isinstance(self.penalty_weight, int) and not isinstance(self.penalty_weight, bool):
            self.penalty_weight = float(self.penalty_weight)
        validate_loss(self.penalty_type, self.penalty_weight, self.loss_impl)
        if self.penalty_weight > 0 and self.penalty_type == "none":  # a sweep over the weight alone: identical runs
            raise ConfigError("penalty_type", "z_loss or max_z_loss when penalty_weight is set (with 'none' the "
                              "weight has no effect)", self.penalty_type)
        if self.rope_kernel != "te" and not self.fuse_qkv_rope:
            raise ConfigError("rope_kernel", "te without fuse_qkv_rope (the kernel is fuse_qkv_rope's)",
                              self.rope_kernel)
        if self.norm_kernel not in NORM_KERNELS:
            raise ConfigError("norm_kernel", "one of " + ", ".join(NORM_KERNELS), self.norm_kernel)
        if self.cuda_graphs and self.gradient_checkpointing:
            raise ConfigError("cuda_graphs", "false with gradient_checkpointing (TE's recompute runs outside "
                                             "the captured graphs)", True)
        if self.init_from is not None and not (isinstance(self.init_from, str) and self.init_from.strip()):
            raise ConfigError("init_from", "a folder path", self.init_from)  # existence: checked at build

