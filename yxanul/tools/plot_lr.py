"""`yxanul plot-lr`: the LR schedule as a PNG, with the warmup end and curriculum stage boundaries
marked, and its value printed at key steps (1, warmup end, 25/50/75 % and the last step).

    yxanul plot-lr                                   # the schedule `yxanul train` runs (embedded default)
    yxanul plot-lr --max_lr 3e-3 --min_lr_ratio 0.1 --warmup_steps 2000 --max_steps 20000 --out lr.png
    yxanul plot-lr --config run.yaml [--max_steps 50000] --out lr.png

The config is resolved as `yxanul train` resolves it (the embedded default without ``--config``; a
default warmup longer than ``max_steps`` adapts the same way); keys of the file that are not config
keys are ignored; flags win. Values come from :func:`yxanul.training.schedule.lr_at` (what the
trainer uses); steps are numbered as the trainer logs them: ``step s`` is the s-th update, which uses
``lr_at(s - 1)``, so the last is ``max_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import DEFAULT_CONFIG, load_yaml, resolve, tokens_per_step_of
from ..errors import ConfigError, UserError
from ..flags import parse_command, same_as
from ..training.args import TrainArgs
from ..training.optim import OptimArgs
from ..training.schedule import Curriculum, lr_at
from .figures import check_figure_out, save_figure


@dataclass
class PlotLRCommand:
    """Plot the learning-rate schedule to a PNG."""

    config: str | None = field(default=None, metadata={"help": "Flat YAML config (keys not used here are ignored).",
                                                       "once": True})
    max_lr: float | None = same_as(OptimArgs, "max_lr", default=None)
    min_lr_ratio: float | None = same_as(OptimArgs, "min_lr_ratio", default=None)
    warmup_steps: int | None = same_as(OptimArgs, "warmup_steps", default=None)
    warmup_tokens: int | None = same_as(OptimArgs, "warmup_tokens", default=None)
    max_steps: int | None = same_as(TrainArgs, "max_steps", default=None)
    lr_decay_steps: int | None = same_as(OptimArgs, "lr_decay_steps", default=None)
    tokens_per_step: int | None = field(default=None, metadata={
        "help": "Tokens per optimizer step (default: from the config's target_tokens_per_step, or "
                "target_effective_batch_size/micro_batch_size x accumulation x seq_length)."})
    out: str | None = field(default=None, metadata={
        "help": "PNG to write (default: lr_schedule.png in the config's output_dir, else in runs/); the path is "
                "printed."})


    def __post_init__(self):
        if self.tokens_per_step is not None and self.tokens_per_step < 1:
            raise ConfigError("tokens_per_step", "a positive integer", self.tokens_per_step)
        check_figure_out("out", self.out)


_SCHEDULE_KEYS = ("max_lr", "min_lr_ratio", "warmup_steps", "warmup_tokens", "max_steps", "lr_decay_steps")


def _values(a: PlotLRCommand) -> dict:
    """The config `yxanul train` would resolve from the same file (the embedded default without one) and
    these flags, as the values `schedule` reads; prints the lines the trainer prints for it (an adapted
    warmup). ``--tokens_per_step`` stands for the run's target_tokens_per_step."""
    path = a.config or DEFAULT_CONFIG
    raw = load_yaml(path)
    flags = {k: getattr(a, k) for k in _SCHEDULE_KEYS if getattr(a, k) is not None}
    if a.tokens_per_step is not None:
        raw.pop("target_effective_batch_size", None)
        flags["target_tokens_per_step"] = a.tokens_per_step
    # config keys not used here are ignored, as documented (a key of no config: one line, as `yxanul train` says
    # it); a flag replaces the file's warmup in the other unit
    cfg = resolve(raw, flags, source=path, user_keys=set(flags) | (set() if a.config is None else set(raw)))
    for line in cfg.notes:
        print(line)
    values = {k: getattr(cfg.optim if k != "max_steps" else cfg.train, k) for k in _SCHEDULE_KEYS}
    values["curriculum"] = cfg.batch.curriculum
    values["tokens_per_step"] = tokens_per_step_of(cfg.batch, cfg.model.seq_length, world_size=1)
    values["out"] = a.out or str(Path(cfg.checkpoint.output_dir or "runs") / "lr_schedule.png")
    return values


def _tokens_per_step(v: dict) -> int | None:
    return int(v["tokens_per_step"]) if v.get("tokens_per_step") else None


def key_steps(max_steps: int, warmup_steps: int) -> dict[str, int]:
    """Named optimizer steps as the trainer logs them (``step s`` = the s-th update, at ``lr_at(s - 1)``):
    the first, the warmup end (the first step at max_lr), 25/50/75 % and the last, ``max_steps``."""
    return {"start": 1, "warmup end": min(warmup_steps + 1, max_steps), "25%": max(1, max_steps // 4),
            "50%": max(1, max_steps // 2), "75%": max(1, 3 * max_steps // 4), "last": max_steps}


@dataclass
class Schedule:
    """The LR of every step of a run and what is marked on the plot."""

    optim: OptimArgs
    max_steps: int
    decay: int
    lrs: list[float]
    tps: int | None
    stages: list[tuple[int, int]]  # (first step, 1-based, seq_length) of each curriculum stage
    warmup_tokens: int | None = None


def schedule(values: dict) -> Schedule:
    """Validate the values and compute the LR at each step with the trainer's :func:`lr_at`."""
    tps = _tokens_per_step(values)
    keys = ("max_lr", "min_lr_ratio", "warmup_steps", "warmup_tokens", "lr_decay_steps")
    o = OptimArgs(**{k: values[k] for k in keys if k in values})
    max_steps = values.get("max_steps", 1000)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigError("max_steps", "an integer >= 1", max_steps)
    decay = o.lr_decay_steps or max_steps
    kw = dict(max_lr=o.max_lr, min_lr_ratio=o.min_lr_ratio, warmup_steps=o.warmup_steps, decay_steps=decay)
    lrs = [lr_at(s - 1, **kw) for s in range(1, max_steps + 1)]  # lrs[s - 1]: the LR of the trainer's step s
    stages = []
    if values.get("curriculum"):
        if tps is None:
            raise UserError("plot-lr: the curriculum needs the tokens per optimizer step: pass --tokens_per_step or "
                            "set target_tokens_per_step in the config")
        cur = Curriculum.from_config(values["curriculum"], tps)
        # a stage's start_step counts the steps before it: its first step, as the trainer logs it, is one later
        stages = [(s.start_step + 1, s.seq_length) for s in cur.stages if s.start_step < max_steps]
    return Schedule(o, max_steps, decay, lrs, tps, stages, o.warmup_tokens)


def plot(sc: Schedule, out: str) -> None:
    """The PNG: the LR over steps (tokens on top when known), warmup end and stage starts marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    o, end = sc.optim, key_steps(sc.max_steps, sc.optim.warmup_steps)["warmup end"]
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=120)
    ax.plot(range(1, sc.max_steps + 1), sc.lrs, lw=1.6, label="learning rate")
    ax.axvline(end, color="tab:orange", ls="--", lw=1, label=f"warmup end: max_lr from step {end}")
    for i, (start, T) in enumerate(sc.stages):
        if start > 1:
            ax.axvline(start, color="tab:green", ls=":", lw=1.2, label="curriculum stage start" if i == 1 else None)
        ax.text(start, o.max_lr * 1.02, f" seq {T}", color="tab:green", fontsize=8, va="bottom")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_ylim(0, o.max_lr * 1.12)
    if sc.tps:
        tps = sc.tps
        sec = ax.secondary_xaxis("top", functions=(lambda s: s * tps / 1e6, lambda t: t * 1e6 / tps))
        sec.set_xlabel(f"tokens (millions; {tps:,} per step)")
    ax.set_title(f"max_lr {o.max_lr:g}, min_lr_ratio {o.min_lr_ratio:g}, warmup {o.warmup_steps}, "
                 f"cosine to step {sc.decay}, {sc.max_steps} steps", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, out, "plot-lr --out")


def report(sc: Schedule, out: str) -> None:
    """The LR at the key steps, the warmup in tokens and the stage starts."""
    if sc.warmup_tokens is not None:
        print(f"warmup {sc.warmup_tokens:,} tokens = {sc.optim.warmup_steps:,} steps ({sc.tps:,} tokens per "
              "optimizer step, rounded up)")
    for name, s in key_steps(sc.max_steps, sc.optim.warmup_steps).items():
        print(f"{name:>10}: step {s:>8}  lr {sc.lrs[s - 1]:.6e}")
    for i, (start, T) in enumerate(sc.stages):
        seen = f" (after {(start - 1) * sc.tps:,} tokens)" if sc.tps else ""
        print(f"   stage {i}: from step {start} seq_length {T}{seen}")
    print(f"wrote {Path(out).absolute()}")


def main(argv: list[str] | None = None) -> int:
    a = parse_command(PlotLRCommand, argv, prog="yxanul plot-lr", description=__doc__.split("\n\n")[0])
    values = _values(a)
    sc = schedule(values)
    plot(sc, values["out"])
    report(sc, values["out"])
    return 0
