"""`yxanul checkpoints RUN_DIR`: the checkpoints of a run and whether each verifies."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..flags import parse_command
from ..run_lock import pinned
from .manifest import has_manifest, read_manifest, verify_checkpoint
from .pointers import checkpoints_dir, pointer_name, read_pointer
from .resume import list_checkpoints


def format_table(run_dir: str | os.PathLike, verify: bool = True) -> str:
    """The checkpoints of a run, one per row, with whether each verifies (``verify=False``: sizes only)."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        return f"no checkpoints under {checkpoints_dir(run_dir)}"
    latest, best = read_pointer(run_dir, "latest"), read_pointer(run_dir, "best")
    rows = [("step", "tokens", "val_loss", "precision", "backend", "saved_at", "", "verified", "path")]
    for c in ckpts:
        with pinned(c["path"]) as here:  # a running training's keep_last cannot prune it while it is hashed
            if here:  # else pruned since it was listed: not a row
                rows.append(_row(c, latest, best, verify))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    for name in ("latest", "best"):
        problem = pointer_name(run_dir, name)[1]
        if problem:
            lines.append(f"warning: {problem}")
    return "\n".join(lines)


def _row(c: dict, latest, best, verify: bool) -> tuple[str, ...]:
    tags = " ".join(t for t, p in (("latest", latest), ("best", best)) if p and str(p) == c["path"])
    val = c.get("val_loss")
    problems = verify_checkpoint(c["path"], state_only=not verify)
    m = read_manifest(c["path"])
    ok = ("ok" + (f" ({m['hash_seconds']:.2f}s sha256)" if m and "hash_seconds" in m else "")
          if has_manifest(c["path"]) else "ok (no manifest: basic checks)")
    return (str(c["step"]), f"{c.get('tokens_seen', 0):,}", f"{val:.4f}" if isinstance(val, (int, float)) else "-",
            str(c.get("precision", "?")), str(c.get("backend", "?")), str(c.get("saved_at", "")),
            tags, "DAMAGED: " + "; ".join(problems) if problems else ok, c["path"])


@dataclass
class CheckpointsCommand:
    """`yxanul checkpoints RUN_DIR`: the checkpoints of a run and whether each verifies."""

    run_dir: str = field(metadata={"help": "the run's --output_dir", "positional": True})
    quick: bool = field(default=False, metadata={"help": "check sizes against the manifest, not the sha256"})


def listing(run_dir: str | os.PathLike, verify: bool = True) -> str:
    """`yxanul checkpoints` and `yxanul train --list_checkpoints`: the table of the run at ``run_dir``; a path that
    is no folder is one line, and the run's checkpoints folder or one checkpoint lists its run (said so)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"run directory '{run_dir}': " + ("not a directory" if run.exists() else "no such directory"))
    said = ""
    if run.resolve().name == "checkpoints" or run.resolve().parent.name == "checkpoints":  # the run's own folders
        run = run.resolve().parent if run.resolve().name == "checkpoints" else run.resolve().parent.parent
        said = f"'{run_dir}' is inside the run directory {run}: its checkpoints\n"
    return said + format_table(run, verify=verify)


def main(argv: list[str] | None = None) -> int:
    """`yxanul checkpoints RUN_DIR [--quick]`: print the checkpoint table of a run."""
    args = parse_command(CheckpointsCommand, argv, prog="yxanul checkpoints", description=main.__doc__)
    print(listing(args.run_dir, verify=not args.quick))
    return 0
