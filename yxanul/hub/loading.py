"""Anything a user points at -> weights, config and tokenizer.

A MODEL argument (``yxanul export|push|generate|eval``) is one of:
  - a run directory (``RUN/checkpoints/best``, else ``latest``, else the newest ``step_N``);
  - a checkpoint folder ``RUN/checkpoints/step_N`` (accelerate's ``model.safetensors``, FSDP2's sharded
    ``pytorch_model_fsdp_0/``, or DeepSpeed's ``pytorch_model/`` folder of a ZeRO run); extra files
    (optimizer, RNG, FP8 state, manifests) are ignored;
  - an export (a folder with ``config.json``: ``yxanul export`` in either format, or any HF causal LM);
  - a PEFT adapter folder (``adapter_config.json``, e.g. LoRA trained with TRL): its base model (any of the
    above, a local folder) with the adapter merged in.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import STATE_FILE, read_state, verified_checkpoint
from ..checkpoint.io import (
    SHARDED_MODEL_DIR,
    is_sharded_checkpoint,
    load_tolerant,
    read_sharded_weights,
    saved_config,
)
from ..data.args import DataArgs
from ..data.prepare import target_dir
from ..data.tokenizer_load import load_prepared_tokenizer
from ..errors import ConfigError, UserError, first_line
from ..models.configuration_yxanul import config_from_preset
from ..models.modeling_yxanul import YxanulForCausalLM
from ..models.state_dict import is_te_gemm_weight, split_qkv_state

log = logging.getLogger(__name__)


@contextlib.contextmanager
def verified_source(path: str | Path, what: str = "MODEL", say=print):
    """`verified_checkpoint` of a MODEL argument: a checkpoint folder, or a run's ``best`` (else
    ``latest``, else newest) checkpoint that verifies; pinned against pruning inside the ``with``."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{what} '{path}': no such file or directory")
    with verified_checkpoint(p, what, say) as ckpt:
        if ckpt is None:
            raise UserError(f"{what} '{path}': not a run directory with checkpoints, a checkpoint folder "
                            f"({STATE_FILE}) or an export (config.json)")
        yield ckpt


def resolve_checkpoint(path: str | Path, what: str = "MODEL", say=print) -> Path:
    """The verified checkpoint behind a MODEL argument (`verified_source`), unpinned once returned."""
    with verified_source(path, what, say) as ckpt:
        return ckpt


ADAPTER_CONFIG = "adapter_config.json"  # peft.utils.CONFIG_NAME: read here without importing peft


def is_export(path: str | Path) -> bool:
    """A model folder as transformers and PEFT save one: an export, or a PEFT adapter (`is_adapter`)."""
    return (Path(path) / "config.json").is_file() or is_adapter(path)


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file() and not (Path(path) / "config.json").is_file()


def read_checkpoint_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint in fp32, TE's ``*_extra_state`` dropped.

    accelerate writes ``model.safetensors``; under FSDP2 one ``torch.distributed.checkpoint`` shard per rank
    in ``pytorch_model_fsdp_0/`` (joined here without a process group); under DeepSpeed, accelerate's
    ``save_state`` writes the engine's own ``pytorch_model/`` folder, whose fp32 master weights DeepSpeed's
    ``zero_to_fp32`` rebuilds (ZeRO 1-3)."""
    files = sorted(ckpt.glob("model*.safetensors"))
    if files:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
    elif is_sharded_checkpoint(ckpt):  # FSDP2: torch.distributed.checkpoint shards, read in one process
        state = read_sharded_weights(ckpt, is_te_gemm_weight)
    elif (ckpt / "pytorch_model").is_dir():
        try:
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        except ImportError as e:
            raise UserError(f"checkpoint '{ckpt}': a DeepSpeed checkpoint; reading it needs deepspeed "
                            f"(pip install yxanul[deepspeed]): {e}") from None
        state = dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="pytorch_model"))
    else:
        raise UserError(f"checkpoint '{ckpt}': no model*.safetensors, no FSDP {SHARDED_MODEL_DIR}/ and no "
                        "DeepSpeed pytorch_model/ folder")
    return {k: v.float() for k, v in split_qkv_state(state).items() if not k.endswith("_extra_state")}


def run_config(ckpt: Path) -> dict[str, Any]:
    """The flat config the checkpoint was written with (``config.yaml``, else the run's), or {}."""
    return saved_config(ckpt) or saved_config(ckpt.parent.parent)


def config_of_checkpoint(ckpt: Path, state: dict[str, torch.Tensor]):
    """The YxanulConfig of a checkpoint: its preset and seq_length from config.yaml, vocabulary and tie
    from the weights (backend torch: the export and the CPU tools need no TE)."""
    cfg = run_config(ckpt)
    emb = state.get("model.embed_tokens.weight", state.get("lm_head.weight"))
    if emb is None:
        raise UserError(f"checkpoint '{ckpt}': no model.embed_tokens.weight in its weights")
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = "lm_head.weight" not in state or torch.equal(state["lm_head.weight"], emb)
    if "model" in cfg:
        shapes = _shapes_of(state)
        kv_width = shapes.pop("kv_width", None)
        config = config_from_preset(cfg["model"], emb.shape[0], int(cfg.get("seq_length", 2048)),
                                    backend="torch", tie_word_embeddings=tied, **shapes)
        config.vocab_size = emb.shape[0]  # the weights' own (a padded preset vocabulary, or not)
        if kv_width is not None:
            config.num_key_value_heads = max(1, kv_width // config.head_dim)
        config.validate_shapes()
        return config
    raise UserError(f"checkpoint '{ckpt}': no config.yaml with the run's 'model' preset next to the weights")


def _shapes_of(state: dict[str, torch.Tensor]) -> dict[str, int]:
    """Layer count, FFN width and KV width read off the weights (the head count comes from the preset)."""
    layers = {int(k.split(".")[2]) for k in state if k.startswith("model.layers.")}
    fc1 = state.get("model.layers.0.layernorm_mlp.fc1_weight")
    k = state.get("model.layers.0.self_attention.layernorm_qkv.key_weight")
    out = {"num_hidden_layers": max(layers) + 1 if layers else None,
           "intermediate_size": fc1.shape[0] // 2 if fc1 is not None else None}
    if k is not None:
        out["kv_width"] = k.shape[0]
    return out


def tokenizer_of_checkpoint(ckpt: Path):
    """The tokenizer the run trained with: from its prepared data folder (``data_dir`` or the cache folder
    that the run's data settings fingerprint to). None (with a warning) when it cannot be found."""
    cfg = run_config(ckpt)
    keys = {k: cfg[k] for k in DataArgs.__dataclass_fields__ if k in cfg}
    try:
        data_dir = keys.get("data_dir") or target_dir(DataArgs(**keys))[0]
        return load_prepared_tokenizer(data_dir)
    except Exception as e:  # noqa: BLE001 - a missing tokenizer must not stop an export of the weights
        log.warning("no tokenizer found for %s (%s): the export has none", ckpt, e)
        return None


def load_checkpoint_model(ckpt: Path):
    """YxanulForCausalLM (torch backend, fp32, eval mode) with a checkpoint's weights."""
    state = read_checkpoint_weights(ckpt)
    config = config_of_checkpoint(ckpt, state)
    model = YxanulForCausalLM(config)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = load_tolerant(model, state)
    if missing or unexpected:
        raise UserError(f"checkpoint '{ckpt}': weights do not match preset {run_config(ckpt).get('model')!r} "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    return model.eval()


def fill_token_ids(model, tokenizer) -> None:
    """bos/eos/pad ids from the tokenizer where the model has none, in its config and its generation config: a
    checkpoint's config comes from its preset, which knows no tokenizer, and without an eos id ``generate()``
    would not stop at end-of-text (an export carries the same ids in its files)."""
    if tokenizer is None:
        return
    gen = getattr(model, "generation_config", None)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(model.config, key, None) is None:
            setattr(model.config, key, getattr(tokenizer, key, None))
        if gen is not None and getattr(gen, key, None) is None:
            setattr(gen, key, getattr(model.config, key))


def device_of(flag: str) -> torch.device:
    """The device a ``--device`` value names: ``auto`` (CUDA if there is one), ``cpu`` or ``cuda[:N]`` of this
    machine; anything else is one line (`yxanul generate` and `eval` check it before loading anything)."""
    if flag == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(flag)
    except RuntimeError:
        device = None
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device is None or device.type not in ("cpu", "cuda") or (device.type == "cuda" and (device.index or 0) >= n):
        where = f"cuda:0..{n - 1}" if n else "no CUDA device here"
        raise ConfigError("device", f"auto, cpu or cuda[:N] ({where})", flag)
    return device


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """(model, tokenizer or None) for any MODEL argument; the model in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    if is_adapter(p):
        return load_adapter(p, device, dtype)
    if is_export(p):
        import json

        kw = {"backend": "torch"} if json.loads((p / "config.json").read_text()).get("model_type") == "yxanul" else {}
        try:  # a yxanul export saved with backend te loads into the torch twin (same names, any device)
            model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype or torch.float32,
                                                         trust_remote_code=False, **kw)
        except (OSError, ValueError) as e:
            why = first_line(e, type(e).__name__)
            raise UserError(f"MODEL '{path}': not loadable by transformers ({why})") from None
        has_tok = any(p.glob("tokenizer*.json"))
        tok = AutoTokenizer.from_pretrained(str(p), trust_remote_code=False) if has_tok else None
    else:
        with verified_source(p) as ckpt:
            model, tok = load_checkpoint_model(ckpt), tokenizer_of_checkpoint(ckpt)
        if dtype is not None:
            model = model.to(dtype)
    fill_token_ids(model, tok)
    return model.to(device).eval(), tok


def load_adapter(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """(model, tokenizer) of a PEFT adapter folder: its base (``base_model_name_or_path``, any MODEL a local folder
    can be) with the adapter merged in (one set of weights: generate, eval and export run it as a plain model);
    the adapter folder's tokenizer, else the base's."""
    import json

    try:
        from peft import PeftModel
    except ImportError as e:
        raise UserError(f"MODEL '{path}': a PEFT adapter; loading it needs peft (pip install peft): {e}") from None
    try:
        base_path = json.loads((path / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"MODEL '{path}': {ADAPTER_CONFIG} is not JSON with a base_model_name_or_path") from None
    base_dir = Path(base_path) if Path(base_path).is_absolute() else (Path.cwd() / base_path)
    if not base_dir.exists() and (path / base_path).exists():  # saved relative to the adapter folder
        base_dir = path / base_path
    if not base_dir.exists():
        raise UserError(f"MODEL '{path}': the adapter's base model '{base_path}' is not a folder here; download it "
                        f"or point base_model_name_or_path in {path / ADAPTER_CONFIG} at a local run or export")
    if is_adapter(base_dir):  # PEFT stacks adapters on a model, never on a saved adapter (and no cycle here)
        raise UserError(f"MODEL '{path}': its base '{base_path}' is another adapter; merge that one into its own base "
                        f"first (`yxanul export {base_path} MERGED --format yxanul`) and point this one at MERGED")
    base, base_tok = load_model(base_dir, "cpu", dtype)
    try:
        with warnings.catch_warnings():  # peft asks transformers' deprecated `is_gradient_checkpointing`: not ours
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
            model = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"MODEL '{path}': the adapter does not fit its base '{base_path}' "
                        f"({first_line(e, type(e).__name__)[:300]})") from None
    tok = base_tok
    if any(path.glob("tokenizer*.json")):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    fill_token_ids(model, tok)
    return model.to(device).eval(), tok


def describe_source(path: str | Path) -> dict[str, Any]:
    """trainer_state of the checkpoint behind ``path`` ({} for an export)."""
    if is_export(path):
        return {}
    return read_state(resolve_checkpoint(path))
