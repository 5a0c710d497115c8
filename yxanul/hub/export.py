"""`yxanul export MODEL OUT [--format llama|yxanul] [--dtype bf16|fp32]`.

``llama``: a standard ``LlamaForCausalLM`` folder (config.json, model.safetensors or shards + index,
tokenizer files, generation_config.json) that plain ``transformers`` loads without yxanul and without
``trust_remote_code``. ``yxanul``: ``save_pretrained`` of ``YxanulForCausalLM`` (loads with
``AutoModelForCausalLM`` after ``import yxanul``).

The name mapping (yxanul/TE <-> Llama) is models/state_dict.py; docs/export.md has the table.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from ..checkpoint import STATE_FILE, EarlierOutput, check_out_spares_runs, read_state, weights_mode_like
from ..errors import ConfigError, UserError
from ..flags import parse_command
from ..models.state_dict import is_llama_state, llama_to_yxanul, yxanul_to_llama
from .card import LOSS_PNG, build_card, plot_loss, read_metrics
from .loading import (
    fill_token_ids,
    is_export,
    load_checkpoint_model,
    load_model,
    read_checkpoint_weights,
    resolve_checkpoint,
    tokenizer_of_checkpoint,
    verified_source,
)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# the one non-empty OUT --overwrite replaces: an earlier export (config.json on top, files only, as HF saves it)
EARLIER = EarlierOutput("yxanul export", "config.json", flat=True)


def llama_config(config, dtype: torch.dtype):
    """The LlamaConfig of a YxanulConfig (no biases, SiLU, default RoPE with the same theta)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim, hidden_act="silu",
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        tie_word_embeddings=config.tie_word_embeddings, attention_bias=False, mlp_bias=False,
        initializer_range=config.initializer_range, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, dtype=dtype,
        architectures=["LlamaForCausalLM"])


def save_llama(model, out: Path, dtype: torch.dtype, max_shard_size: str) -> None:
    """Write config.json + safetensors (sharded above ``max_shard_size``, with the index) for Llama.
    huggingface_hub's save_torch_state_dict does the sharding and index exactly as save_pretrained."""
    from huggingface_hub import save_torch_state_dict

    cfg = model.config
    state = yxanul_to_llama({k: v.to(dtype) for k, v in model.state_dict().items()}, cfg.tie_word_embeddings)
    save_torch_state_dict(state, str(out), max_shard_size=max_shard_size, metadata={"format": "pt"})
    llama_config(cfg, dtype).save_pretrained(str(out))


def save_generation_config(config, out: Path) -> None:
    """The ids the tokenizer really has: no pad id unless it defines a pad token (the bundled one has
    only <|endoftext|> = bos = eos). generate() then pads with eos and, given the tokenizer's
    attention_mask, needs to infer nothing."""
    from transformers import GenerationConfig

    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(str(out))


RUN_FILES = ("config.yaml", "metrics.jsonl", "precision_report.json")


def write_run_files(out: Path, ckpt: Path, config, license: str, repo_id: str | None, fmt: str = "llama") -> None:
    """Next to the weights: the checkpoint's trainer_state.json, the run's config.yaml, metrics.jsonl and
    precision report, the loss-curve PNG and the model card (README.md)."""
    run_dir = ckpt.parent.parent
    shutil.copy2(ckpt / STATE_FILE, out / STATE_FILE)
    for name in RUN_FILES:
        src = ckpt / name if (ckpt / name).is_file() else run_dir / name
        if src.is_file():
            shutil.copy2(src, out / name)
    has_plot = plot_loss(read_metrics(run_dir), out / LOSS_PNG) is not None
    (out / "README.md").write_text(build_card(config, run_dir, read_state(ckpt), license, repo_id, has_plot,
                                                  fmt))


def export(source: str | Path, out: str | Path, fmt: str = "llama", dtype: str = "bf16",
           max_shard_size: str = "5GB", overwrite: bool = False, license: str = "other",
           repo_id: str | None = None) -> Path:
    """Export the model behind ``source`` (run dir, checkpoint or yxanul export) into ``out``; from a run
    or checkpoint, with its training files and a model card (``license``/``repo_id`` go into the card)."""
    if fmt not in ("llama", "yxanul"):
        raise UserError(f"export --format: expected llama or yxanul, got {fmt!r}")
    check_shard_size(max_shard_size)
    out = Path(out)
    check_out_spares_runs(out, source, "export OUT", overwrite, EARLIER)
    if is_export(source):
        with _written_into(out) as tmp:
            model, tok = load_model(source)
            if getattr(model.config, "model_type", None) != "yxanul":
                raise UserError(f"export MODEL '{source}': a {model.config.model_type} export, not a yxanul model "
                                "(export the run or checkpoint it came from; or use it as it is: transformers loads "
                                "it)")
            _write_files(model, tok, None, tmp, fmt, dtype, max_shard_size, license, repo_id)
        return out
    with verified_source(source) as ckpt:  # verified, and pinned: a running training cannot prune it meanwhile
        check_out_spares_runs(out, ckpt, "export OUT", overwrite, EARLIER)  # the checkpoint a run directory names
        with _written_into(out) as tmp:
            model, tok = load_checkpoint_model(ckpt), tokenizer_of_checkpoint(ckpt)
            _write_files(model, tok, ckpt, tmp, fmt, dtype, max_shard_size, license, repo_id)
    return out


def check_shard_size(value: str) -> None:
    """``max_shard_size`` as huggingface_hub's savers will parse it (their own parser: a private module, so an
    import that moves is no error here), checked before anything is written: a size of at least one byte (0GB or
    -1GB would write one shard per tensor)."""
    try:
        from huggingface_hub.serialization._base import parse_size_to_int
    except ImportError:  # pragma: no cover - a huggingface_hub that moved it: its saver still checks
        return
    try:
        size = parse_size_to_int(str(value))
    except (ValueError, OverflowError):  # OverflowError: infGB
        size = 0
    if size < 1:
        raise ConfigError("max_shard_size", "a size such as 5GB or 500MB, above 0 (units TB, GB, MB, KB)", value)


@contextlib.contextmanager
def _written_into(out: Path):
    """A new folder beside ``out`` to write into, made before the model loads (an OUT that cannot be created or
    written is one line then, not an error after the work), swapped in when the block ends: a failure half-way
    leaves ``out`` as it was (an ``--overwrite`` deleted the previous export first)."""
    full = Path(os.path.abspath(out))  # "." gets its name: the folder beside it is named after it
    tmp = full.parent / f".{full.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if full.is_dir() and not os.access(full, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        tmp.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"export OUT '{out}': cannot be written ({e.strerror or type(e).__name__}); choose another "
                        "folder") from None
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, full)


def _swap_in(tmp: Path, out: Path) -> None:
    """``tmp`` becomes ``out``: renamed to it when ``out`` is new; else (empty, an earlier export under
    --overwrite, or the current directory, which cannot be renamed) its files are moved into ``out`` and the
    earlier export's other files removed (files only: `check_out_spares_runs` let no folder in)."""
    if not out.exists():
        os.rename(tmp, out)
        return
    new = {f.name for f in tmp.iterdir()}
    for f in tmp.iterdir():
        shutil.move(str(f), str(out / f.name))  # os.rename (replacing) on one filesystem, else a copy
    for f in out.iterdir():
        if f.name not in new:
            f.unlink()  # e.g. the shards of an earlier export sharded otherwise
    tmp.rmdir()


def _write_files(model, tok, ckpt, out: Path, fmt, dtype, max_shard_size, license, repo_id) -> None:
    fill_token_ids(model, tok)
    if fmt == "llama":
        save_llama(model, out, DTYPES[dtype], max_shard_size)
    else:
        model.config.backend = "torch"
        model.to(DTYPES[dtype]).save_pretrained(str(out), max_shard_size=max_shard_size)
    save_generation_config(model.config, out)
    if tok is not None:
        tok.init_kwargs.pop("local_files_only", None)  # how it was loaded here, not a setting for its users
        # the model's positions, not the 1e30/1e6 placeholder: truncation=True then cuts where the model ends
        tok.model_max_length = int(model.config.max_position_embeddings)
        tok.save_pretrained(str(out))
    for f in out.glob("model*.safetensors*"):  # written 0600 by huggingface_hub: config.json's mode instead
        weights_mode_like(f, out / "config.json")
    if ckpt is not None:
        write_run_files(out, ckpt, model.config, license, repo_id, fmt)


def read_weights_any(path: str | Path) -> dict[str, torch.Tensor]:
    """Weights of a checkpoint or export folder, in yxanul names."""
    p = Path(path)
    if is_export(p):
        from safetensors.torch import load_file

        state = {}
        for f in sorted(p.glob("model*.safetensors")):
            state.update(load_file(str(f)))
        return llama_to_yxanul(state) if is_llama_state(state) else state
    return read_checkpoint_weights(resolve_checkpoint(p))


@dataclass
class ExportCommand:
    """Export a run, checkpoint or yxanul export as a Llama (or yxanul) folder for plain transformers."""

    model: str = field(metadata={"positional": True, "help": "Run directory (its best, else latest checkpoint), "
                                                            "checkpoint folder, or yxanul export."})
    out: str = field(metadata={"positional": True, "help": "Output folder (new or empty)."})
    format: Literal["llama", "yxanul"] = field(default="llama", metadata={
        "help": "llama: LlamaForCausalLM, loads without yxanul; yxanul: save_pretrained of YxanulForCausalLM."})
    dtype: Literal["bf16", "fp32"] = field(default="bf16", metadata={"help": "Dtype of the saved weights."})
    max_shard_size: str = field(default="5GB", metadata={"help": "Shard the weights above this size (e.g. 2GB)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace an earlier export in OUT."})

    def __post_init__(self):
        check_shard_size(self.max_shard_size)


def main(argv: list[str] | None = None) -> int:
    a = parse_command(ExportCommand, argv, prog="yxanul export")
    out = export(a.model, a.out, a.format, a.dtype, a.max_shard_size, a.overwrite)
    files = sorted(f.name for f in out.iterdir())
    print(f"exported {a.model} as {a.format} ({a.dtype}) to {out}: {', '.join(files)}")
    return 0
