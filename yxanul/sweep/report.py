"""The results of a sweep: a table, ``best.json`` and PNGs, from the trials' ``metrics.jsonl``.

Trials are ranked like W&B ranks sweep runs: by the metric's last logged value (W&B's run summary),
``goal`` minimize or maximize. The loss curves of all trials go on one plot with
:func:`yxanul.tools.compare.plot` (the same figure as ``yxanul compare``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import median
from typing import Any

from ..errors import UserError
from ..tools.compare import Curves, plot, read_run
from ..tracking import read_metrics


def trial_row(trial: dict[str, Any], metric: str) -> dict[str, Any] | None:
    """One trial's numbers from its run directory (None when it has logged nothing yet)."""
    f = Path(trial["run_dir"]) / "metrics.jsonl"
    if not f.is_file():
        return None
    rows = read_metrics(f)
    section, key = metric.split("/", 1)
    by_step: dict[int, float] = {}
    for r in rows:  # after a resume the last row of a step wins (as in yxanul compare)
        value = _logged(r, section, key)
        if value is not None:
            by_step[int(r["step"])] = value
    val = {int(r["step"]): float(r["val_loss"]) for r in rows if "val_loss" in r}
    train = [r for r in rows if "tokens_per_sec" in r and r.get("step", 0) > 1]  # step 1 includes start-up
    precisions = [r["precision"] for r in rows if "precision" in r]
    final = by_step[max(by_step)] if by_step else None
    return {"trial": trial["id"], "params": trial.get("config", trial["params"]), "status": trial.get("status"),
            "metric": metric, "final": final,
            "final_val_loss": val[max(val)] if val else None, "best_val_loss": min(val.values()) if val else None,
            "last_step": max((int(r["step"]) for r in rows if "step" in r), default=0),
            "tokens_per_sec": median(r["tokens_per_sec"] for r in train) if train else None,
            "precision": max(set(precisions), key=precisions.count) if precisions else None,
            "run_dir": trial["run_dir"]}


def _logged(row: dict[str, Any], section: str, key: str) -> Any:
    """The value a tracker got as ``section/key`` from this metrics.jsonl row (None: not this row's).
    ``train/ppl`` is not in the rows: the trainer logs it as exp of the LM loss (the penalty left out)."""
    if ("val_loss" in row) != (section == "eval"):
        return None
    if section == "train" and key == "ppl" and key not in row and "loss" in row:
        return math.exp(min(row.get("lm_loss", row["loss"]), 50))
    return row.get(key)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return "-" if v is None else str(v)


def format_table(rows: list[dict[str, Any]], swept: list[str], metric: str) -> str:
    """Markdown table: trial, swept parameters, final/best val loss, the metric, tokens/s, precision."""
    head = ["trial", *swept, "final val_loss", "best val_loss"]
    head += [] if metric == "eval/val_loss" else [f"final {metric}"]
    head += ["tokens/s", "precision", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["trial"], *(_fmt(r["params"].get(k)) for k in swept), _fmt(r["final_val_loss"]),
                 _fmt(r["best_val_loss"])]
        cells += [] if metric == "eval/val_loss" else [_fmt(r["final"])]
        cells += [_fmt(r["tokens_per_sec"]), _fmt(r["precision"]), _fmt(r["status"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_param(rows: list[dict[str, Any]], param: str, metric: str, out: Path) -> None:
    """The metric's final value against one swept parameter (a log x axis when it spans > 20x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r["params"][param], r["final"]) for r in rows if r["final"] is not None and param in r["params"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x, _ in pts)
    xs = [x if numeric else str(x) for x, _ in pts]
    ax.plot(xs, [y for _, y in pts], "o", markersize=7)
    positive = [x for x, _ in pts if numeric and x > 0]
    if numeric and positive and len(positive) == len(pts) and max(positive) / min(positive) > 20:
        ax.set_xscale("log")
    ax.set_xlabel(param)
    ax.set_ylabel(f"final {metric}")
    ax.set_title(f"{metric} vs {param}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def summarize(root: Path, say=print) -> dict[str, Any] | None:
    """Table (printed and ``summary.md``), ``best.json``, ``<metric>_vs_<param>.png``, ``loss_curves.png``."""
    state_path = root / "sweep.json"
    if not state_path.is_file():
        raise UserError(f"yxanul sweep --summary: no sweep under '{root}' (run the sweep first, same --output_root)")
    state = json.loads(state_path.read_text())
    swept = state["swept"]  # the file's varying parameters (even when one trial ran)
    rows = [r for r in (trial_row(t, state["metric"]) for t in state["trials"]) if r is not None]
    table = format_table(rows, swept, state["metric"])
    (root / "summary.md").write_text(f"# sweep {state['name']} ({state['method']}, {state['metric']} "
                                     f"{state['goal']})\n\n{table}\n")
    say(table)
    ranked = [r for r in rows if r["final"] is not None and math.isfinite(r["final"])]
    if not ranked:
        say(f"sweep {state['name']}: no trial has logged {state['metric']} yet")
        return None
    best = (min if state["goal"] == "minimize" else max)(ranked, key=lambda r: r["final"])
    best = {**best, "goal": state["goal"], "sweep": state["name"]}
    (root / "best.json").write_text(json.dumps(best, indent=2))
    stem = state["metric"].replace("/", "_")
    for p in swept:
        plot_param(ranked, p, state["metric"], root / f"{stem}_vs_{p}.png")
    curves = [_curves(r, swept) for r in rows]
    curves = [c for c in curves if c is not None]
    if curves:  # the LM loss: the penalty term differs between trials by design (validation is LM-only too)
        plot(curves, root / "loss_curves.png", ylabel="LM loss (without the penalty)")
    say(f"best: {best['trial']} {best['params']} final {state['metric']} {best['final']:.4f} "
        f"({best['run_dir']}); wrote {root / 'summary.md'}, {root / 'best.json'} and PNGs in {root}")
    return best


def _curves(row: dict[str, Any], swept: list[str]) -> Curves | None:
    label = row["trial"] + "".join(f" {k}={_fmt(row['params'][k])}" for k in swept)
    try:
        return read_run(row["run_dir"], label, loss_key="lm_loss")
    except UserError:  # no training row yet
        return None
