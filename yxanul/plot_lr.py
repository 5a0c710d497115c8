"""`yxanul plot-lr --config FILE [training flags] [--out lr.png]`: the LR schedule as a PNG, with the
warmup end and curriculum stage boundaries marked, and its value at key steps printed."""

from __future__ import annotations

import argparse

from .optim import lr_at


def schedule(cfg) -> tuple[list[int], list[float], dict[str, int]]:
    o, max_steps = cfg.optim, cfg.train.max_steps
    decay = o.lr_decay_steps or max_steps
    steps = list(range(max_steps + 1))
    lrs = [lr_at(s, max_lr=o.max_lr, min_lr_ratio=o.min_lr_ratio, warmup_steps=o.warmup_steps, decay_steps=decay)
           for s in steps]
    keys = {"start": 0, "warmup end": min(o.warmup_steps, max_steps), "25%": max_steps // 4, "50%": max_steps // 2,
            "75%": 3 * max_steps // 4, "decay end": min(decay, max_steps), "last": max_steps}
    return steps, lrs, keys


def main(argv: list[str] | None = None) -> int:
    from .config import parse_args

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--out", default="lr_schedule.png", help="PNG to write (default: lr_schedule.png)")
    pre.add_argument("--tokens_per_step", type=int, default=None,
                     help="for curriculum boundaries given in tokens (default: from target_tokens_per_step)")
    ours, rest = pre.parse_known_args(argv)
    if rest and rest[0] in ("-h", "--help"):
        print(__doc__)
        pre.print_help()
        return 0
    cfg = parse_args(rest, prog="yxanul plot-lr")
    steps, lrs, keys = schedule(cfg)
    boundaries = []
    if cfg.batch.curriculum:
        from .curriculum import Curriculum

        tps = ours.tokens_per_step or cfg.batch.target_tokens_per_step or (
            cfg.batch.micro_batch_size * cfg.batch.gradient_accumulation_steps * cfg.model.seq_length)
        boundaries = [b for b in Curriculum.from_config(cfg.batch.curriculum, tps).boundaries() if b <= steps[-1]]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4), dpi=120)
    ax.plot(steps, lrs, lw=1.5, label="learning rate")
    ax.axvline(keys["warmup end"], color="tab:orange", ls="--", lw=1, label=f"warmup end ({keys['warmup end']})")
    for i, b in enumerate(boundaries):
        ax.axvline(b, color="tab:green", ls=":", lw=1, label="curriculum stage boundary" if i == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"max_lr {cfg.optim.max_lr:g}, min_lr_ratio {cfg.optim.min_lr_ratio:g}, "
                 f"warmup {cfg.optim.warmup_steps}, decay to step {cfg.optim.lr_decay_steps or cfg.train.max_steps}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(ours.out)
    plt.close(fig)
    for name, s in keys.items():
        print(f"{name:>10}: step {s:>7}  lr {lrs[s]:.6e}")
    for i, b in enumerate(boundaries):
        print(f"   stage {i + 1}: from step {b}")
    print(f"wrote {ours.out}")
    return 0
