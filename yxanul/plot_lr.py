"""`yxanul plot-lr`: the LR schedule as a PNG, with the warmup end and curriculum stage boundaries
marked, and its value printed at key steps (0, warmup end, 25/50/75 % and the last step).

    yxanul plot-lr --max_lr 3e-3 --min_lr_ratio 0.1 --warmup_steps 2000 --max_steps 20000 --out lr.png
    yxanul plot-lr --config run.yaml [--max_steps 50000] --out lr.png

Values come from :func:`yxanul.optim.lr_at` (what the trainer uses). ``--config`` reads a flat YAML
file; only the keys used here are read (max_lr, min_lr_ratio, warmup_steps, max_steps,
lr_decay_steps, curriculum and what gives the tokens per step), other keys are ignored; flags win.
"""

from __future__ import annotations

import argparse

from .errors import ConfigError, UserError
from .optim import OptimArgs, lr_at

_KEYS = ("max_lr", "min_lr_ratio", "warmup_steps", "max_steps", "lr_decay_steps", "tokens_per_step")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"plot-lr: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="yxanul plot-lr", description=__doc__.split("\n\n")[0], argument_default=argparse.SUPPRESS,
                allow_abbrev=False)
    p.add_argument("--config", help="flat YAML config (unknown keys ignored here)")
    p.add_argument("--max_lr", type=float, help="peak LR (default 6e-4)")
    p.add_argument("--min_lr_ratio", type=float, help="final LR / max_lr (default 0.1)")
    p.add_argument("--warmup_steps", type=int, help="linear warmup steps (default 100)")
    p.add_argument("--max_steps", type=int, help="optimizer steps of the run (default 1000)")
    p.add_argument("--lr_decay_steps", type=int, help="step where the cosine reaches its floor (default max_steps)")
    p.add_argument("--tokens_per_step", type=int, help="tokens per optimizer step (default: from the config's "
                   "target_tokens_per_step, or target_effective_batch_size/micro_batch_size x accumulation x seq_length)")
    p.add_argument("--out", default="lr_schedule.png", help="PNG to write (default lr_schedule.png)")
    return p


def _coerce(values: dict) -> None:
    """YAML gives '3e-3' as a string and 2000.0 as a float: make the keys used here numbers."""
    for k, kind in (("max_lr", float), ("min_lr_ratio", float), ("warmup_steps", int), ("max_steps", int),
                    ("lr_decay_steps", int), ("tokens_per_step", int), ("target_tokens_per_step", int),
                    ("target_effective_batch_size", int), ("micro_batch_size", int),
                    ("gradient_accumulation_steps", int), ("seq_length", int)):
        v = values.get(k)
        if v is None:
            continue
        try:
            if isinstance(v, bool):
                raise ValueError
            f = float(str(v).replace("_", ""))
            if kind is int and not f.is_integer():
                raise ValueError
            values[k] = kind(f)
        except ValueError:
            raise ConfigError(k, "an integer" if kind is int else "a number", v) from None


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


def main(argv: list[str] | None = None) -> int:
    ns = vars(_parser().parse_args(argv))
    values: dict = {}
    if "config" in ns:
        from .config import load_yaml

        values.update(load_yaml(ns.pop("config")))
    out = ns.pop("out")
    values.update(ns)  # flags override the file
    _coerce(values)
    o = OptimArgs(**{k: values[k] for k in ("max_lr", "min_lr_ratio", "warmup_steps", "lr_decay_steps") if k in values})
    max_steps = values.get("max_steps", 1000)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigError("max_steps", "an integer >= 1", max_steps)
    decay = o.lr_decay_steps or max_steps
    kw = dict(max_lr=o.max_lr, min_lr_ratio=o.min_lr_ratio, warmup_steps=o.warmup_steps, decay_steps=decay)
    steps = list(range(max_steps))
    lrs = [lr_at(s, **kw) for s in steps]

    tps = _tokens_per_step(values)
    stages = []
    if values.get("curriculum"):
        from .curriculum import Curriculum

        if tps is None:
            raise UserError("plot-lr: the curriculum needs the tokens per optimizer step: pass --tokens_per_step or "
                            "set target_tokens_per_step in the config")
        cur = Curriculum.from_config(values["curriculum"], tps)
        stages = [(s.start_step, s.seq_length) for s in cur.stages if s.start_step < max_steps]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = key_steps(max_steps, o.warmup_steps)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=120)
    ax.plot(steps, lrs, lw=1.6, label="learning rate")
    ax.axvline(keys["warmup end"], color="tab:orange", ls="--", lw=1, label=f"warmup end (step {keys['warmup end']})")
    for i, (start, T) in enumerate(stages):
        if start > 0:
            ax.axvline(start, color="tab:green", ls=":", lw=1.2, label="curriculum stage start" if i == 1 else None)
        ax.text(start, o.max_lr * 1.02, f" seq {T}", color="tab:green", fontsize=8, va="bottom")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_ylim(0, o.max_lr * 1.12)
    if tps:
        sec = ax.secondary_xaxis("top", functions=(lambda s: s * tps / 1e6, lambda t: t * 1e6 / tps))
        sec.set_xlabel(f"tokens (millions; {tps:,} per step)")
    ax.set_title(f"max_lr {o.max_lr:g}, min_lr_ratio {o.min_lr_ratio:g}, warmup {o.warmup_steps}, "
                 f"cosine to step {decay}, {max_steps} steps", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)

    for name, s in keys.items():
        print(f"{name:>10}: step {s:>8}  lr {lrs[s]:.6e}")
    for i, (start, T) in enumerate(stages):
        print(f"   stage {i}: from step {start} seq_length {T}"
              + (f" ({start * tps:,} tokens)" if tps else ""))
    print(f"wrote {out}")
    return 0
