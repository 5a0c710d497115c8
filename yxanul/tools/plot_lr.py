"""`yxanul plot-lr`: the LR schedule as a PNG, with the warmup end and curriculum stage boundaries
marked, and its value printed at key steps (0, warmup end, 25/50/75 % and the last step).

    yxanul plot-lr --max_lr 3e-3 --min_lr_ratio 0.1 --warmup_steps 2000 --max_steps 20000 --out lr.png
    yxanul plot-lr --config run.yaml [--max_steps 50000] --out lr.png

Values come from :func:`yxanul.training.schedule.lr_at` (what the trainer uses). ``--config`` reads a flat YAML
file; only the keys used here are read (max_lr, min_lr_ratio, warmup_steps, max_steps,
warmup_tokens, lr_decay_steps, curriculum and what gives the tokens per step), other keys are ignored; flags win.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError, UserError
from ..optim import OptimArgs
from ..training.schedule import lr_at


@dataclass
class PlotLRArgs:
    """Plot the learning-rate schedule to a PNG."""

    config: str | None = field(default=None, metadata={"help": "Flat YAML config (keys not used here are ignored)."})
    max_lr: float | None = field(default=None, metadata={"help": "Peak LR (default 6e-4)."})
    min_lr_ratio: float | None = field(default=None, metadata={"help": "Final LR / max_lr (default 0.1)."})
    warmup_steps: int | None = field(default=None, metadata={"help": "Linear warmup steps (default 100)."})
    warmup_tokens: int | None = field(default=None, metadata={
        "help": "The warmup in tokens instead of steps: rounded up to whole steps of the tokens per step (as "
                "`yxanul train` does)."})
    max_steps: int | None = field(default=None, metadata={"help": "Optimizer steps of the run (default 1000)."})
    lr_decay_steps: int | None = field(default=None, metadata={"help": "Step where the cosine reaches its floor "
                                                               "(default max_steps)."})
    tokens_per_step: int | None = field(default=None, metadata={
        "help": "Tokens per optimizer step (default: from the config's target_tokens_per_step, or "
                "target_effective_batch_size/micro_batch_size x accumulation x seq_length)."})
    out: str = field(default="lr_schedule.png", metadata={"help": "PNG to write."})


_YAML_INTS = ("target_tokens_per_step", "target_effective_batch_size", "micro_batch_size",
              "gradient_accumulation_steps", "seq_length")


def _values(a: PlotLRArgs) -> dict:
    """The YAML file's keys used here (typed like the flags), then the flags that were given."""
    from ..config import load_yaml
    from ..flags import coerce, fields_of

    typed = {k: tp for k, (_, tp) in fields_of(PlotLRArgs).items()} | {k: int | None for k in _YAML_INTS}
    raw = load_yaml(a.config) if a.config else {}
    values = {k: coerce(k, typed[k], v, from_cli=False) for k, v in raw.items() if k in typed and k != "config"}
    values["curriculum"] = raw.get("curriculum")
    flags = {k: v for k, v in vars(a).items() if v is not None and k not in ("config", "out")}
    for one, other in (("warmup_steps", "warmup_tokens"), ("warmup_tokens", "warmup_steps")):
        if one in flags and other not in flags:
            values.pop(other, None)  # a flag replaces the file's warmup in the other unit
    return values | flags


def _tokens_per_step(v: dict) -> int | None:
    if v.get("tokens_per_step"):
        return int(v["tokens_per_step"])
    if v.get("target_tokens_per_step"):
        return int(v["target_tokens_per_step"])
    T = v.get("seq_length")
    if not T:
        return None
    if v.get("target_effective_batch_size"):
        return int(v["target_effective_batch_size"]) * int(T)
    if v.get("micro_batch_size"):
        return int(v["micro_batch_size"]) * int(v.get("gradient_accumulation_steps") or 1) * int(T)
    return None


def key_steps(max_steps: int, warmup_steps: int) -> dict[str, int]:
    """Named optimizer steps (0-based; the last update of a run of ``max_steps`` uses step max_steps-1)."""
    last = max_steps - 1
    return {"start": 0, "warmup end": min(warmup_steps, last), "25%": max_steps // 4, "50%": max_steps // 2,
            "75%": 3 * max_steps // 4, "last": last}


@dataclass
class Schedule:
    """The LR of every step of a run and what is marked on the plot."""

    optim: OptimArgs
    max_steps: int
    decay: int
    lrs: list[float]
    tps: int | None
    stages: list[tuple[int, int]]  # (start step, seq_length) of each curriculum stage
    warmup_tokens: int | None = None


def schedule(values: dict) -> Schedule:
    """Validate the values and compute the LR at each step with the trainer's :func:`lr_at`."""
    tps = _tokens_per_step(values)
    if values.get("warmup_tokens") is not None:
        from ..config import apply_warmup_tokens

        apply_warmup_tokens(values, tps)
    keys = ("max_lr", "min_lr_ratio", "warmup_steps", "warmup_tokens", "lr_decay_steps")
    o = OptimArgs(**{k: values[k] for k in keys if k in values})
    max_steps = values.get("max_steps", 1000)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigError("max_steps", "an integer >= 1", max_steps)
    decay = o.lr_decay_steps or max_steps
    kw = dict(max_lr=o.max_lr, min_lr_ratio=o.min_lr_ratio, warmup_steps=o.warmup_steps, decay_steps=decay)
    lrs = [lr_at(s, **kw) for s in range(max_steps)]
    stages = []
    if values.get("curriculum"):
        from ..training.schedule import Curriculum

        if tps is None:
            raise UserError("plot-lr: the curriculum needs the tokens per optimizer step: pass --tokens_per_step or "
                            "set target_tokens_per_step in the config")
        cur = Curriculum.from_config(values["curriculum"], tps)
        stages = [(s.start_step, s.seq_length) for s in cur.stages if s.start_step < max_steps]
    return Schedule(o, max_steps, decay, lrs, tps, stages, o.warmup_tokens)


def plot(sc: Schedule, out: str) -> None:
    """The PNG: the LR over steps (tokens on top when known), warmup end and stage starts marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    o, end = sc.optim, key_steps(sc.max_steps, sc.optim.warmup_steps)["warmup end"]
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=120)
    ax.plot(range(sc.max_steps), sc.lrs, lw=1.6, label="learning rate")
    ax.axvline(end, color="tab:orange", ls="--", lw=1, label=f"warmup end (step {end})")
    for i, (start, T) in enumerate(sc.stages):
        if start > 0:
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
    fig.savefig(out)
    plt.close(fig)


def report(sc: Schedule, out: str) -> None:
    """The LR at the key steps, the warmup in tokens and the stage starts."""
    if sc.warmup_tokens is not None:
        print(f"warmup {sc.warmup_tokens:,} tokens = {sc.optim.warmup_steps:,} steps ({sc.tps:,} tokens per "
              "optimizer step, rounded up)")
    for name, s in key_steps(sc.max_steps, sc.optim.warmup_steps).items():
        print(f"{name:>10}: step {s:>8}  lr {sc.lrs[s]:.6e}")
    for i, (start, T) in enumerate(sc.stages):
        print(f"   stage {i}: from step {start} seq_length {T}" + (f" ({start * sc.tps:,} tokens)" if sc.tps else ""))
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    from ..flags import parse_command

    a = parse_command(PlotLRArgs, argv, prog="yxanul plot-lr", description=__doc__.split("\n\n")[0])
    sc = schedule(_values(a))
    plot(sc, a.out)
    report(sc, a.out)
    return 0
