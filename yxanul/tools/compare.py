"""`yxanul compare RUN_A RUN_B [...]`: loss curves of runs on one plot, and how far they are apart.

Reads each run directory's `metrics.jsonl` (training rows and evaluation rows; after a resume the
last row of a step wins). The first run is the baseline (e.g. BF16); for every other run (e.g. FP8)
it prints the relative difference of the mean training loss over the last `--window` of the common
steps and of the last common validation loss, plots both curves (raw and smoothed) and the relative
difference to a PNG, and with `--tolerance` exits 1 when a run is further from the baseline than that.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, UserError
from ..flags import parse_command
from .figures import check_figure_out, save_figure


@dataclass
class Curves:
    """One run's metrics."""

    name: str
    label: str
    train: dict[int, float]
    val: dict[int, float]
    lm_only: bool = False  # ``train`` is the LM loss of rows that also logged a penalty term


def read_run(path: str | Path, label: str | None = None, loss_key: str = "loss") -> Curves:
    """A run's training and validation losses by step (a resumed step: its last row). ``loss_key``
    "lm_loss": the language-model loss without a penalty term where the rows have it."""
    d = Path(path)
    f = d / "metrics.jsonl" if d.is_dir() else d
    if not f.is_file():
        raise UserError(f"compare: '{path}': no metrics.jsonl (expected a run directory of `yxanul train`)")
    train, val, precisions, lm_only = {}, {}, Counter(), False
    for i, line in enumerate(f.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"compare: {f}:{i}: not a JSON line") from None
        if isinstance(row, dict) and isinstance(row.get("stage"), str):  # a curriculum's stage is its index
            raise UserError(f"compare: {f}: metrics of `yxanul grpo` ({row['stage']} stage rows: its SFT and GRPO "
                            "losses are no pretraining loss); compare runs of `yxanul train`")
        if "loss" in row and "step" in row:
            train[int(row["step"])] = float(row.get(loss_key, row["loss"]))
            lm_only |= loss_key != "loss" and loss_key in row
            precisions[row.get("precision", "?")] += 1
        if "val_loss" in row and "step" in row:
            val[int(row["step"])] = float(row["val_loss"])
    if not train:
        raise UserError(f"compare: {f}: no training rows (step, loss)")
    name = d.name if d.is_dir() else d.parent.name
    prec = precisions.most_common(1)[0][0]
    return Curves(name, label or f"{name} ({prec})", train, val, lm_only)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (shorter at the start); window 1: the values."""
    if window <= 1:
        return list(values)
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def compare(base: Curves, other: Curves, window: float = 0.2) -> dict:
    """Relative differences of ``other`` against ``base`` (positive: ``other`` has the higher loss)."""
    common = sorted(set(base.train) & set(other.train))
    if not common:
        raise UserError(f"compare: '{base.name}' and '{other.name}' share no logged step")
    tail = common[-max(1, int(round(len(common) * window))):]
    a = sum(base.train[s] for s in tail) / len(tail)
    b = sum(other.train[s] for s in tail) / len(tail)
    out = {"run": other.label, "baseline": base.label, "common_steps": len(common),
           "window_steps": [tail[0], tail[-1]], "train_loss_baseline": a, "train_loss": b,
           "train_rel_diff": (b - a) / a, "notes": []}
    ends = (max(base.train), max(other.train))
    if ends[0] != ends[1]:  # the common steps are then the shorter run's: say so, the reader may expect the ends
        out["notes"].append(f"the runs end at different steps ({ends[0]} and {ends[1]}): compared on the "
                            f"{len(common)} logged step(s) they share, up to step {common[-1]}")
    if len(tail) < 3:
        out["notes"].append(f"the training-loss mean covers {len(tail)} logged step(s): a weak comparison (log "
                            "more often, --log_freq, or widen --window)")
    vcommon = sorted(set(base.val) & set(other.val))
    if vcommon:
        s = vcommon[-1]
        out.update(val_step=s, val_loss_baseline=base.val[s], val_loss=other.val[s],
                   val_rel_diff=(other.val[s] - base.val[s]) / base.val[s])
    return out


def smoothing_window(runs: list[Curves], requested: int) -> int:
    """The moving average's points: at most a tenth of the shortest run's logged points (1: no smoothing,
    so a few points are plotted as they are; a long window over few points drags early losses forward)."""
    return max(1, min(requested, min(len(r.train) for r in runs) // 10))


def plot(runs: list[Curves], out: Path, smooth_points: int = 10, ylabel: str = "loss") -> dict[str, list]:
    """The figure (the curves; below, each run's % against the first) written to ``out``; returns the
    plotted series: ``{label: [(step, train value as drawn, % vs the first run or None)]}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    base = runs[0]
    w, drawn = smoothing_window(runs, smooth_points), {}
    bsteps = sorted(base.train)
    bsmooth = dict(zip(bsteps, smooth([base.train[s] for s in bsteps], w)))
    for i, r in enumerate(runs):
        steps = sorted(r.train)
        color = f"C{i}"
        ys = [r.train[s] for s in steps]
        few = len(steps) <= 60
        ax.plot(steps, ys, ".-" if few else "-", color=color, alpha=1.0 if w == 1 else 0.3,
                linewidth=1.4 if w == 1 else 0.8, label=f"{r.label} (train)" if w == 1 else None)
        sm = smooth(ys, w)
        if w > 1:
            ax.plot(steps, sm, color=color, linewidth=1.8, label=f"{r.label} (train, {w}-point mean)")
        if r.val:
            vs = sorted(r.val)
            ax.plot(vs, [r.val[s] for s in vs], "o--", color=color, markersize=4, label=f"{r.label} (val)")
        rel = {s: 100 * (v - bsmooth[s]) / bsmooth[s] for s, v in zip(steps, sm) if s in bsmooth}
        if i:
            ax2.plot(list(rel), list(rel.values()), ".-" if few else "-", color=color, label=r.label)
        drawn[r.label] = [(s, v, rel.get(s) if i else None) for s, v in zip(steps, sm)]
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel}: train and validation")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax2.axhline(0, color="C0", linewidth=1)
    ax2.set_ylabel(f"train, % vs {base.name}")
    ax2.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # steps are whole numbers
    ax2.set_xlabel("step")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out, "compare --out", dpi=120)
    return drawn


@dataclass
class CompareCommand:
    """Plot and compare the loss curves of runs."""

    runs: list[str] = field(metadata={"positional": True, "metavar": "RUN",
                                      "help": "run directories (the first one is the baseline)"})
    labels: str | None = field(default=None, metadata={"help": "Comma-separated legend labels, one per run "
                                                       "(default: name + precision)."})
    out: str = field(default="compare.png", metadata={"help": "PNG to write."})
    window: float = field(default=0.2, metadata={"help": "Fraction of the common steps, at the end, whose mean "
                                                 "training loss is compared."})
    smooth: int = field(default=10, metadata={"help": "Points of the moving average in the plot (at most a tenth of "
                                                      "the logged points: fewer are plotted unsmoothed)."})
    tolerance: float | None = field(default=None, metadata={"help": "Exit 1 when |relative difference| of the final "
                                                            "training loss (or of the last val loss) exceeds this, "
                                                            "e.g. 0.02."})
    json: bool = field(default=False, metadata={"help": "Print the comparison as JSON."})

    def __post_init__(self):
        if len(self.runs) < 2:
            raise UserError("compare: give at least two run directories")
        if not 0 < self.window <= 1:
            raise ConfigError("window", "a number in (0, 1]", self.window)
        if self.smooth < 1:
            raise ConfigError("smooth", "an integer >= 1", self.smooth)
        if self.labels and len(self.labels.split(",")) != len(self.runs):
            raise ConfigError("labels", f"{len(self.runs)} comma-separated labels", self.labels)
        if self.tolerance is not None and not 0 <= self.tolerance < float("inf"):
            raise ConfigError("tolerance", "a relative difference >= 0, e.g. 0.02", self.tolerance)
        check_figure_out("out", self.out)


def main(argv: list[str] | None = None) -> int:
    """`yxanul compare RUN_A RUN_B [...] [--out compare.png] [--tolerance 0.02]`."""
    a = parse_command(CompareCommand, argv, prog="yxanul compare", description=__doc__.split("\n\n")[0])
    labels = a.labels.split(",") if a.labels else [None] * len(a.runs)
    # a penalty run's `loss` holds its penalty term: the LM loss is what compares with a run without one
    runs = [read_run(r, lab, loss_key="lm_loss") for r, lab in zip(a.runs, labels)]
    results = [compare(runs[0], r, a.window) for r in runs[1:]]
    what = "train LM loss (without the penalty term)" if any(r.lm_only for r in runs) else "train loss"
    plot(runs, Path(a.out), a.smooth, ylabel="LM loss" if what != "train loss" else "loss")
    if a.json:
        print(json.dumps(results, indent=2))
    failed = False
    for res in results:
        line = (f"{res['run']} vs {res['baseline']}: {what} {res['train_loss']:.4f} vs "
                f"{res['train_loss_baseline']:.4f} ({100 * res['train_rel_diff']:+.2f}%, mean of steps "
                f"{res['window_steps'][0]}-{res['window_steps'][1]})")
        diffs = [res["train_rel_diff"]]
        if "val_rel_diff" in res:
            line += (f"; val loss {res['val_loss']:.4f} vs {res['val_loss_baseline']:.4f} "
                     f"({100 * res['val_rel_diff']:+.2f}% at step {res['val_step']})")
            diffs.append(res["val_rel_diff"])
        if a.tolerance is not None:
            ok = all(math.isfinite(x) and abs(x) <= a.tolerance for x in diffs)
            failed |= not ok
            line += f"  [{'within' if ok else 'OUTSIDE'} {100 * a.tolerance:g}%]"
        print(line)
        for note in res["notes"]:
            print(f"  note: {note}")
    print(f"wrote {a.out}")
    return 1 if failed else 0
