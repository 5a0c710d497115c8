"""`ModelArgs`: which model the trainer builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError
from .configuration_yxanul import PRESETS, YxanulConfig, config_from_preset, count_parameters


@dataclass
class ModelArgs:
    """Model architecture and backend."""

    model: str = field(default="tiny", metadata={"help": "Preset: " + ", ".join(PRESETS) + " (see docs/models.md)."})
    backend: Literal["auto", "te", "torch"] = field(
        default="auto", metadata={"help": "Layer implementation: te (Transformer Engine), torch, or auto "
                                          "(te when it imports and a CUDA GPU is present)."})
    seq_length: int = field(default=1024, metadata={"help": "Tokens per training sequence."})
    tie_word_embeddings: bool | None = field(default=None, metadata={"help": "Share the LM head with the input embedding (default: true)."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute activations in backward to save memory."})
    init_from: str | None = field(
        default=None, metadata={"help": "Initialise weights from a save_pretrained folder or a checkpoint "
                                        "folder (model.safetensors); optimizer and data start fresh."})

    def __post_init__(self):
        if self.model not in PRESETS:
            raise ConfigError("model", "one of " + ", ".join(PRESETS), self.model)
        if self.seq_length < 2:
            raise ConfigError("seq_length", "an integer >= 2", self.seq_length)


def build_model(args: ModelArgs, vocab_size: int):
    """The model of ``args`` for a tokenizer of ``vocab_size`` tokens (padded to a multiple of 64)."""
    from .modeling_yxanul import YxanulForCausalLM

    overrides = {}
    if args.tie_word_embeddings is not None:
        overrides["tie_word_embeddings"] = args.tie_word_embeddings
    config = config_from_preset(args.model, vocab_size, args.seq_length, backend=args.backend, **overrides)
    model = YxanulForCausalLM(config)
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if args.init_from:
        load_weights(model, args.init_from)
    return model


def load_weights(model, path: str) -> None:
    from pathlib import Path

    from safetensors.torch import load_file

    from ..errors import UserError

    files = sorted(Path(path).glob("model*.safetensors")) if Path(path).is_dir() else []
    if not files:
        raise UserError(f"init_from '{path}': no model*.safetensors in that folder")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state") and k != "lm_head.weight"]
    if missing or unexpected:
        raise UserError(f"init_from '{path}': weights do not match the model "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]}): same --model preset?")
    model.tie_weights()


def describe(config: YxanulConfig) -> str:
    n = count_parameters(config)
    return (f"model: {n / 1e6:.2f}M parameters | {config.num_hidden_layers} layers x {config.hidden_size} hidden, "
            f"{config.num_attention_heads} heads ({config.num_key_value_heads} kv), ffn {config.intermediate_size}, "
            f"vocab {config.vocab_size}, tied={config.tie_word_embeddings} | backend {config.backend}")
