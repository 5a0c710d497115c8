"""`ModelArgs`: which model the trainer builds; `build_model()` and the one-line `describe()`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..errors import ConfigError, UserError
from ..flags import did_you_mean
from .presets import BACKENDS, PRESETS

PENALTY_TYPES = ("none", "z_loss", "max_z_loss")
LOSS_IMPLS = ("default", "chunked", "te")


def validate_loss(penalty_type, penalty_weight, loss_impl) -> None:
    """One-line ConfigError for a bad penalty/loss setting (ModelArgs and YxanulConfig share it; no torch)."""
    if penalty_type not in PENALTY_TYPES:
        raise ConfigError("penalty_type", "one of " + ", ".join(PENALTY_TYPES), penalty_type)
    if (isinstance(penalty_weight, bool) or not isinstance(penalty_weight, (int, float))
            or not math.isfinite(penalty_weight) or penalty_weight < 0):
        raise ConfigError("penalty_weight", "a number >= 0", penalty_weight)
    if loss_impl not in LOSS_IMPLS:
        raise ConfigError("loss_impl", "one of " + ", ".join(LOSS_IMPLS), loss_impl)

if TYPE_CHECKING:
    from .configuration_yxanul import YxanulConfig


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
        if self.cuda_graphs and self.gradient_checkpointing:
            raise ConfigError("cuda_graphs", "false with gradient_checkpointing (TE's recompute runs outside "
                                             "the captured graphs)", True)
        if self.init_from is not None and not (isinstance(self.init_from, str) and self.init_from.strip()):
            raise ConfigError("init_from", "a folder path", self.init_from)  # existence: checked at build


def build_model(args: ModelArgs, vocab_size: int):
    """The model of ``args`` for a tokenizer of ``vocab_size`` tokens (padded up to a multiple of 64)."""
    from .configuration_yxanul import config_from_preset
    from .cuda_graphs import check_config
    from .modeling_yxanul import YxanulForCausalLM

    config = config_from_preset(args.model, vocab_size, args.seq_length, backend=args.backend,
                                tie_word_embeddings=args.tie_word_embeddings, penalty_type=args.penalty_type,
                                penalty_weight=args.penalty_weight, loss_impl=args.loss_impl,
                                fuse_qkv_params=args.fuse_qkv_params, cuda_graphs=args.cuda_graphs)
    model = YxanulForCausalLM(config)
    check_config(model.config)  # cuda_graphs: TE blocks on CUDA (a training setting: from_pretrained skips it)
    if args.gradient_checkpointing:
        model.set_activation_checkpointing(True)
    if args.init_from:
        load_weights(model, args.init_from)
    return model


def load_weights(model, path: str) -> None:
    """Load ``path/model*.safetensors`` (or an FSDP2 checkpoint's shards) into ``model`` (strict apart from
    TE's ``*_extra_state`` and a tied LM head that a save dropped as a duplicate). Mismatches raise a
    one-line UserError."""
    from safetensors.torch import load_file

    from ..checkpoint import verified_weights_dir

    verified_weights_dir(path, "init_from")  # a checkpoint folder must match its manifest
    from ..training.fsdp import is_sharded_checkpoint, read_sharded_weights

    files = sorted(Path(path).glob("model*.safetensors")) if Path(path).is_dir() else []
    if not files and not is_sharded_checkpoint(path):
        raise UserError(f"init_from '{path}': no model*.safetensors (nor FSDP2 shards) in that folder")
    state = {} if files else read_sharded_weights(path)  # FSDP2: the shards joined in this process
    for f in files:
        state.update(load_file(str(f)))
    from ..hub.export import is_llama_state, llama_to_yxanul

    if is_llama_state(state):  # a `yxanul export --format llama` folder: back to yxanul's names
        state = llama_to_yxanul(state)
    if model.config.tie_word_embeddings:  # a tied save may keep either name of the shared tensor
        emb, head = "model.embed_tokens.weight", "lm_head.weight"
        if emb not in state and head in state:
            state[emb] = state[head]
        state.pop(head, None)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # size mismatch
        first = str(e).strip().splitlines()[-1].strip()
        raise UserError(f"init_from '{path}': weights do not fit this model's shapes ({first}): "
                        f"same --model preset and tokenizer?") from None
    missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise UserError(f"init_from '{path}': weights do not match the model (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}): same --model preset?")
    model.tie_weights()


def describe(config: YxanulConfig) -> str:
    """One line for the start of a run: size, shape, vocabulary, tie and backend."""
    from .configuration_yxanul import count_parameters

    n = count_parameters(config)
    return (f"model: {n / 1e6:.2f}M parameters | {config.num_hidden_layers} layers x {config.hidden_size} hidden, "
            f"{config.num_attention_heads} heads ({config.num_key_value_heads} kv), ffn {config.intermediate_size}, "
            f"vocab {config.vocab_size}, tied={config.tie_word_embeddings} | backend {config.backend}")
