"""Build the model of a ``ModelArgs`` (``build_model``), load weights into it (``load_weights``: a
checkpoint, a yxanul or a Llama export) and the one line that describes it (``describe``)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from ..checkpoint.io import is_sharded_checkpoint, load_tolerant, read_sharded_weights
from ..checkpoint.resume import verified_weights_dir
from ..errors import UserError
from .args import ModelArgs
from .configuration_yxanul import YxanulConfig, config_from_preset, count_parameters
from .cuda_graphs import check_config
from .modeling_yxanul import YxanulForCausalLM, resolve_backend
from .state_dict import is_llama_state, is_te_gemm_weight, llama_to_yxanul, split_qkv_state


def model_config(args: ModelArgs, vocab_size: int) -> YxanulConfig:
    """The config of ``args`` for a tokenizer of ``vocab_size`` tokens (padded up to a multiple of 64), its
    backend resolved: what the precision plan decides from before the model is built."""
    config = config_from_preset(args.model, vocab_size, args.seq_length, backend=args.backend,
                                tie_word_embeddings=args.tie_word_embeddings, penalty_type=args.penalty_type,
                                penalty_weight=args.penalty_weight, loss_impl=args.loss_impl,
                                fuse_qkv_params=args.fuse_qkv_params, fuse_qkv_rope=args.fuse_qkv_rope,
                                rope_kernel=args.rope_kernel, norm_kernel=args.norm_kernel,
                                cuda_graphs=args.cuda_graphs)
    config.backend = resolve_backend(config.backend)
    return config


def build_model(args: ModelArgs, vocab_size: int, config: YxanulConfig | None = None):
    """The model of ``args`` (of ``config`` when given, from `model_config`)."""
    model = YxanulForCausalLM(config or model_config(args, vocab_size))
    check_config(model.config)  # cuda_graphs: TE blocks on CUDA (a training setting: from_pretrained skips it)
    if args.gradient_checkpointing:
        model.set_activation_checkpointing(True)
    if args.init_from:
        load_weights(model, args.init_from)
    return model


def read_weights(path: str, model) -> dict:
    """The weights of ``path`` under ``model``'s names: ``model*.safetensors`` (or an FSDP2 checkpoint's
    shards), a Llama export's names mapped back, a tied head under the embedding's name."""
    if not Path(path).exists():
        raise UserError(f"init_from '{path}': no such file or directory")
    verified_weights_dir(path, "init_from")  # a checkpoint folder must match its manifest
    files = sorted(Path(path).glob("model*.safetensors")) if Path(path).is_dir() else []
    if not files and (Path(path) / "adapter_config.json").is_file():  # PEFT's; the export merges it into its base
        raise UserError(f"init_from '{path}': a PEFT adapter, not a model; merge it into its base first: `yxanul "
                        f"export {path} MERGED --format yxanul --dtype fp32`, then --init_from MERGED")
    if not files and not is_sharded_checkpoint(path):
        raise UserError(f"init_from '{path}': no model*.safetensors (nor FSDP2 shards) in that folder")
    state = {} if files else read_sharded_weights(path, is_te_gemm_weight)  # FSDP2: the shards joined in this process
    for f in files:
        state.update(load_file(str(f)))
    state = split_qkv_state(state)  # a fused QKV weight a save kept whole (no-op otherwise)
    if is_llama_state(state):  # a `yxanul export --format llama` folder: back to yxanul's names
        state = llama_to_yxanul(state)
    return _tied_as_the_model(state, model.config.tie_word_embeddings, path)


def _tied_as_the_model(state: dict, tied: bool, path: str) -> dict:
    """A tied save may keep either name of the shared tensor; a trained head of its own is never dropped into a
    tied model, nor a tied one's missing head left to the generic mismatch: one line naming the key."""
    emb, head = "model.embed_tokens.weight", "lm_head.weight"
    untied = emb in state and head in state and not torch.equal(state[emb], state[head])
    if tied and untied:
        raise UserError(f"init_from '{path}': its LM head is trained apart from the embedding; pass "
                        "--tie_word_embeddings false (a tied model would drop it)")
    if not tied and emb in state and head not in state:
        raise UserError(f"init_from '{path}': its LM head is the embedding (tied); pass --tie_word_embeddings true")
    if tied:
        if emb not in state and head in state:
            state[emb] = state[head]
        state.pop(head, None)
    return state


def load_weights(model, path: str) -> None:
    """Load `read_weights` into ``model`` (strict apart from TE's ``*_extra_state`` and a tied LM head that
    a save dropped as a duplicate). Mismatches raise a one-line UserError."""
    state = read_weights(path, model)
    try:
        missing, unexpected = load_tolerant(model, state)
    except RuntimeError as e:  # size mismatch
        first = str(e).strip().splitlines()[-1].strip()
        raise UserError(f"init_from '{path}': weights do not fit this model's shapes ({first}): "
                        f"same --model preset and tokenizer?") from None
    if missing or unexpected:
        raise UserError(f"init_from '{path}': weights do not match the model (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}): same --model preset?")
    model.tie_weights()


def describe(config: YxanulConfig) -> str:
    """One line for the start of a run: size, shape, vocabulary, tie and backend."""
    n = count_parameters(config)
    return (f"model: {n / 1e6:.2f}M parameters | {config.num_hidden_layers} layers x {config.hidden_size} hidden, "
            f"{config.num_attention_heads} heads ({config.num_key_value_heads} kv), ffn {config.intermediate_size}, "
            f"vocab {config.vocab_size}, tied={config.tie_word_embeddings} | backend {config.backend}")
