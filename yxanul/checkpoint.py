"""Checkpoints: ``RUN/checkpoints/step_N/`` written atomically, a ``latest`` pointer, best-by-val-loss
kept, the last ``keep_last`` kept, and a listing table.

Layout of one checkpoint (everything accelerate's ``save_state`` writes, plus ours)::

    step_N/
      model.safetensors, optimizer.bin, random_states_*.pkl   # accelerate.save_state
      trainer_state.json   # step, tokens_seen, epoch, data position, precision, backend, val_loss
      config.yaml          # the resolved config of the run that wrote it

Atomicity: every rank writes into ``.tmp-step_N``; after a barrier the main process writes
``trainer_state.json`` last and renames the folder to ``step_N`` (one ``rename`` on one file
system), then replaces the ``latest`` pointer with ``os.replace``. A crash at any moment leaves
either the old checkpoint set or the new one, never a half-written ``step_N``. Re-saving an
existing step moves the old copy to ``.old-step_N`` first and deletes it only after the new one is
in place; until then listings and ``resume`` use the old copy, and the next save restores it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError, UserError

STATE_FILE = "trainer_state.json"


@dataclass
class CheckpointArgs:
    """Run directory and checkpoints."""

    output_dir: str | None = field(
        default=None,
        metadata={"help": "Run directory: config, checkpoints, metrics.jsonl, TensorBoard events and "
                          "samples all live under it (default: runs/<run_name>)."})
    run_name: str | None = field(default=None, metadata={"help": "Name of the run (default: <model>-<date>-<time>)."})
    resume: str | None = field(
        default=None,
        metadata={"help": "Resume from 'latest' (the newest checkpoint under output_dir) or a checkpoint path."})
    list_checkpoints: bool = field(default=False, metadata={"help": "Print the checkpoints of output_dir and exit."})
    checkpoint_freq: int = field(default=250, metadata={"help": "Save a checkpoint every N optimizer steps (0: only at the end)."})
    keep_last: int = field(default=3, metadata={"help": "Keep the newest N checkpoints (the best by val loss is always kept)."})
    save_final: bool = field(default=True, metadata={"help": "Save a checkpoint when training ends."})

    def __post_init__(self):
        if self.checkpoint_freq < 0:
            raise ConfigError("checkpoint_freq", "an integer >= 0", self.checkpoint_freq)
        if self.keep_last < 1:
            raise ConfigError("keep_last", "an integer >= 1", self.keep_last)


def run_dir_of(cfg) -> Path:
    """The run directory of a config: ``output_dir``, else ``runs/<run_name>`` (default name:
    ``<model>-<timestamp>``). Fills both fields in ``cfg.checkpoint``."""
    ck = cfg.checkpoint
    if ck.run_name is None:
        ck.run_name = f"{cfg.model.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    if ck.output_dir is None:
        ck.output_dir = str(Path("runs") / ck.run_name)
    return Path(ck.output_dir)


def prepare_run_dir(cfg) -> Path:
    """`run_dir_of`, refusing what would lose or misplace work: ``resume: latest`` without a fixed
    run directory (the default name is new at every launch), an output_dir under a file, and a new
    run (no ``resume``) into a directory holding checkpoints, whose ``latest`` it would take over."""
    ck = cfg.checkpoint
    if ck.resume == "latest" and ck.output_dir is None and ck.run_name is None:
        raise UserError("resume 'latest': set --output_dir or --run_name too (the default run directory is "
                        "new at every launch)")
    run_dir = run_dir_of(cfg)
    existing = next(p for p in (run_dir, *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"output_dir '{run_dir}': '{existing}' exists and is not a directory")
    ckpts = [] if ck.resume else list_checkpoints(run_dir)
    if ckpts:
        raise UserError(f"output_dir '{run_dir}' already holds checkpoints (newest: step {ckpts[-1]['step']}): add "
                        "--resume latest to continue that run, or choose another --output_dir/--run_name")
    return run_dir


def load_for_resume(accelerator, ckpt: Path, cfg) -> None:
    """`accelerator.load_state`, with one line naming the model settings that differ from the
    checkpoint's ``config.yaml`` when its weights do not fit this model."""
    handle = accelerator.register_load_state_pre_hook(_load_models_with_views)
    try:
        accelerator.load_state(str(ckpt))
    except RuntimeError as e:
        if "state_dict" not in str(e):
            raise
        import dataclasses

        import yaml

        path = Path(ckpt) / "config.yaml"
        theirs = yaml.safe_load(path.read_text()) if path.is_file() else {}
        ours = cfg.to_flat_dict()
        diff = [f"{f.name}: {theirs[f.name]!r} -> {ours.get(f.name)!r}" for f in dataclasses.fields(cfg.model)
                if f.name in theirs and theirs[f.name] != ours.get(f.name)]
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        first = lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]  # torch's header line
        first = first if len(first) <= 300 else first[:297] + "..."
        raise UserError(f"resume '{ckpt}': its weights do not fit this model ("
                        + ("; ".join(diff) if diff else first) + ")") from None
    finally:
        handle.remove()


def _own_storage_for_views(models: list, weights: list, output_dir: str) -> None:
    """accelerate's save-state pre-hook: give every tensor that is a *part* of a larger storage a
    storage of its own, in the state dicts about to be written.

    Before safetensors, accelerate drops every tensor that shares a storage with an earlier one
    (``clean_state_dict_for_safetensors``), meant for tied weights. TE's ``query_weight``,
    ``key_weight`` and ``value_weight`` are views of one fused buffer, so ``key_weight`` and
    ``value_weight`` were silently left out of every TE checkpoint. A tied head is the same whole
    tensor as the embedding: it is left shared and dropped as intended (the load restores it)."""
    import torch

    for state in weights:
        for name, t in state.items():
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel() and (
                    t.data_ptr() != t.untyped_storage().data_ptr()
                    or t.numel() * t.element_size() != t.untyped_storage().nbytes()):
                state[name] = t.clone()


def _load_models_with_views(models: list, input_dir: str) -> None:
    """accelerate's load-state pre-hook: load each ``model[_i].safetensors`` ourselves and take the
    models off accelerate's list (the hook's documented use).

    accelerate loads with ``safetensors.torch.load_model``, which refuses any parameter that is a view
    into a larger storage ("None is covering the entire storage"). TE's ``LayerNormLinear`` with
    ``parameters_split`` registers ``query_weight``/``key_weight``/``value_weight`` as views of ONE
    fused buffer, so every TE checkpoint failed to resume that way (seen on an H100, 2026-11-25).
    ``load_state_dict`` copies into the views in place. Missing keys are forgiven only where the
    model's own state dict aliases them to a loaded tensor (a tied head that the save dropped) or
    they are TE ``_extra_state`` (the model's load hooks); anything else raises, as strict loading did.
    """
    from safetensors.torch import load_file

    paths = [Path(input_dir) / f"model{'_' + str(i) if i else ''}.safetensors" for i in range(len(models))]
    if not all(p.is_file() for p in paths):
        return  # accelerate's own fallback (pytorch_model.bin) for all of them: the file names
        #       # follow the list positions, so take none off
    for model, path in zip(models, paths):
        device = next((t.device for t in model.parameters() if t.device.type != "meta"), "cpu")
        state = load_file(str(path), device=str(device))
        missing, unexpected = model.load_state_dict(state, strict=False)
        own = model.state_dict()
        loaded_ptrs = {own[k].data_ptr() for k in state if k in own}
        missing = [k for k in missing if own[k].data_ptr() not in loaded_ptrs]
        if missing or unexpected:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}: "
                               f"missing keys {missing[:5]}, unexpected keys {list(unexpected)[:5]}")
    models.clear()


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def list_checkpoints(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Complete checkpoints (with a trainer_state.json) sorted by step."""
    root = checkpoints_dir(run_dir)
    out = []
    if not root.is_dir():
        return out
    for d in root.iterdir():
        if d.name.startswith(".old-step_") and not (root / d.name[len(".old-"):] / STATE_FILE).is_file():
            pass  # a crash while this step was being replaced: the old copy is the checkpoint
        elif not d.name.startswith("step_"):
            continue
        if d.is_dir() and (d / STATE_FILE).is_file():
            try:
                state = json.loads((d / STATE_FILE).read_text())
            except (OSError, json.JSONDecodeError):
                continue
            state["path"] = str(d)
            out.append(state)
    return sorted(out, key=lambda s: s["step"])


def _pointer(run_dir, name: str) -> Path | None:
    p = checkpoints_dir(run_dir) / name
    if not p.is_file():
        return None
    name = p.read_text().strip()
    for target in (checkpoints_dir(run_dir) / name, checkpoints_dir(run_dir) / f".old-{name}"):
        if (target / STATE_FILE).is_file():
            return target
    return None


def resolve_resume(resume: str, run_dir: str | os.PathLike) -> Path | None:
    """'latest' -> newest complete checkpoint of run_dir (None if there is none); else a path."""
    if resume == "latest":
        latest = _pointer(run_dir, "latest")
        if latest is not None:
            return latest
        ckpts = list_checkpoints(run_dir)
        return Path(ckpts[-1]["path"]) if ckpts else None
    p = Path(resume)
    if (p / STATE_FILE).is_file():
        return p
    if (checkpoints_dir(p) / "latest").is_file() or list_checkpoints(p):
        return resolve_resume("latest", p)
    raise UserError(f"resume '{resume}': not a checkpoint (no {STATE_FILE}) nor a run directory with checkpoints")


def read_state(ckpt: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(ckpt) / STATE_FILE).read_text())


def save_checkpoint(accelerator, run_dir: str | os.PathLike, state: dict[str, Any], *,
                    keep_last: int, config_yaml: str | None = None,
                    extra: Callable[[Path], None] | None = None,
                    _fault: Callable[[str], None] | None = None) -> Path:
    """Save ``accelerator`` state + ``state`` as ``checkpoints/step_{state['step']}`` atomically.

    Must be called on every process (DeepSpeed saves are collective). ``_fault`` is a test hook
    called with a stage name ("after_state", "after_swap") to simulate a crash mid-save. ``extra(tmp_dir)`` writes
    more files (main process) before the folder is committed.
    """
    root = checkpoints_dir(run_dir)
    step = int(state["step"])
    final, tmp = root / f"step_{step}", root / f".tmp-step_{step}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-step_*"):  # leftovers of a crashed save
            shutil.rmtree(stale, ignore_errors=True)
        for old in root.glob(".old-step_*"):  # a crash while replacing a step: keep whichever is whole
            whole = root / old.name[len(".old-"):]
            if (whole / STATE_FILE).is_file():
                shutil.rmtree(old, ignore_errors=True)
            else:
                shutil.rmtree(whole, ignore_errors=True)
                os.rename(old, whole)
    accelerator.wait_for_everyone()
    # accelerate warns "Removed shared tensor {'lm_head.weight'}" at every save of a tied model;
    # expected here (the tie is restored on load, which the resume tests check), so keep it quiet.
    quiet = logging.getLogger("accelerate.utils.other")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    handle = accelerator.register_save_state_pre_hook(_own_storage_for_views)
    try:
        accelerator.save_state(str(tmp), safe_serialization=True)
    finally:
        handle.remove()
        quiet.setLevel(level)
    accelerator.wait_for_everyone()
    if _fault:
        _fault("after_state")
    if accelerator.is_main_process:
        if config_yaml is not None:
            (tmp / "config.yaml").write_text(config_yaml)
        if extra is not None:
            extra(tmp)
        state = dict(state, saved_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
        _write_atomic(tmp / STATE_FILE, json.dumps(state, indent=2))
        old = root / f".old-{final.name}"
        if final.exists():  # re-saving a step (a resume from an older checkpoint): swap, then delete
            os.rename(final, old)
            if _fault:
                _fault("after_swap")
        os.rename(tmp, final)
        _fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
        _write_atomic(root / "latest", final.name + "\n")
        _update_best(run_dir, state, final)
        _prune(run_dir, keep_last)
    accelerator.wait_for_everyone()
    return final


def _update_best(run_dir, state, final: Path) -> None:
    val = state.get("val_loss")
    if val is None:
        return
    best = _pointer(run_dir, "best")
    if best is None or val < read_state(best).get("val_loss", float("inf")):
        _write_atomic(checkpoints_dir(run_dir) / "best", final.name + "\n")


def _prune(run_dir, keep_last: int) -> None:
    ckpts = list_checkpoints(run_dir)
    keep = {c["path"] for c in ckpts[-keep_last:]}
    for name in ("best", "latest"):
        p = _pointer(run_dir, name)
        if p is not None:
            keep.add(str(p))
    for c in ckpts:
        if c["path"] not in keep:
            shutil.rmtree(c["path"], ignore_errors=True)


def format_table(run_dir: str | os.PathLike) -> str:
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        return f"no checkpoints under {checkpoints_dir(run_dir)}"
    latest, best = _pointer(run_dir, "latest"), _pointer(run_dir, "best")
    rows = [("step", "tokens", "val_loss", "precision", "backend", "saved_at", "", "path")]
    for c in ckpts:
        tags = " ".join(t for t, p in (("latest", latest), ("best", best)) if p and str(p) == c["path"])
        val = c.get("val_loss")
        rows.append((str(c["step"]), f"{c.get('tokens_seen', 0):,}", f"{val:.4f}" if val is not None else "-",
                     str(c.get("precision", "?")), str(c.get("backend", "?")), str(c.get("saved_at", "")),
                     tags, c["path"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def main(argv: list[str] | None = None) -> int:
    """`yxanul checkpoints RUN_DIR`: print the checkpoint table of a run."""
    import argparse

    parser = argparse.ArgumentParser(prog="yxanul checkpoints", description=main.__doc__)
    parser.add_argument("run_dir", help="the run's --output_dir")
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        raise UserError(f"run directory '{args.run_dir}': no such directory")
    print(format_table(args.run_dir))
    return 0
