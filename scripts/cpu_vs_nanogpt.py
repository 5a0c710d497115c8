#!/usr/bin/env python
"""CPU: yxanul's training step against nanoGPT's model at the same shape (issue 22, point 6).

    python scripts/cpu_vs_nanogpt.py [--threads 2] [--rounds 6] [--steps 5] [--train_steps 40] [--out cpu.json]

Times, in ONE process and interleaved (A, B, A, B, ... per round; warm-up steps excluded; median step):

(A) yxanul: the ``nano`` preset built by yxanul's own code (``config_from_preset`` + ``YxanulForCausalLM``,
    torch backend, FP32 plan from ``resolve_precision`` + ``plan.prepare_model``), yxanul's AdamW
    (``optim.build_optimizer``), and ``training.step.train_step`` -- THE function the trainer calls -- on
    the loader's packed (B, T + 1) uint16 batches, LR set every step, clip 1.0.
(B) nanoGPT: ``scripts/nanogpt_model.py`` (n_layer 4, n_head 4, n_embd 256, bias False, dropout 0, same
    vocab and block size), its ``configure_optimizers`` AdamW and nanoGPT's loop: forward with targets,
    backward, clip 1.0, step, zero_grad(set_to_none=True); x/y cut from the same uint16 windows.

Both get the same token windows (random ids: the speed of a GEMM does not depend on values). Optionally
(``--train_steps N``) also the whole ``yxanul train`` loop at the same shape, as it prints tok/sec
(a subprocess on the bundled corpus, after the interleaved rounds; steps after the first log only).
FLOPs/token is yxanul's formula for both (6 x matmul params + 12 x L x C x T): tok/s x FLOPs/token
(GFLOP/s) is the architecture-fair comparison (SwiGLU/GQA nano does 4 % fewer FLOPs than GELU GPT).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # nanogpt_model next to this file
from nanogpt_model import GPT, GPTConfig  # noqa: E402

from yxanul.models.configuration_yxanul import config_from_preset, count_parameters, matmul_parameters  # noqa: E402
from yxanul.training.schedule import lr_at  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    p.add_argument("--seq_length", type=int, default=256)
    p.add_argument("--micro_batch_size", type=int, default=8)
    p.add_argument("--vocab_size", type=int, default=8192, help="the bundled tokenizer's 8192")
    p.add_argument("--preset", default="nano")
    p.add_argument("--rounds", type=int, default=6, help="A,B rounds")
    p.add_argument("--steps", type=int, default=5, help="timed steps per model per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
    p.add_argument("--train_steps", type=int, default=0, help="also run `yxanul train` for N steps (0: skip)")
    p.add_argument("--train_runs", type=int, default=2, help="`yxanul train` runs, each followed by nanoGPT steps")
    p.add_argument("--ablations", action="store_true", help="also time yxanul without RoPE / with LayerNorm: "
                   "which part of the gap is architecture (" + ", ".join(ABLATIONS) + ")")
    p.add_argument("--profile", default=None, help="folder: torch.profiler CPU op tables of both (3 steps each)")
    p.add_argument("--out", default=None, help="JSON file with the environment and rows")
    a = p.parse_args(argv)
    for key in ("threads", "seq_length", "micro_batch_size", "vocab_size", "rounds", "steps"):
        if getattr(a, key) < 1:
            p.error(f"--{key}: expected an integer >= 1, got {getattr(a, key)}")
    return a


def lr_of(step: int, total: int) -> float:
    return lr_at(step, max_lr=6e-4, min_lr_ratio=0.1, warmup_steps=100, decay_steps=max(total, 101))


def build_yxanul(a):
    """(step(i, window) -> loss, row info): the trainer's model, plan, optimizer and step function."""
    from yxanul.models.modeling_yxanul import YxanulForCausalLM
    from yxanul.precision import PrecisionArgs, resolve_precision
    from yxanul.training.optim import OptimArgs, build_optimizer
    from yxanul.training.step import train_step

    config = config_from_preset(a.preset, a.vocab_size, a.seq_length, backend="torch")
    plan = resolve_precision(PrecisionArgs(mixed_precision="fp32"), config, say=lambda *_: None)
    torch.manual_seed(1337)
    model = YxanulForCausalLM(config)
    model.train()
    plan.prepare_model(model, say=lambda *_: None)
    opt = build_optimizer(model, OptimArgs())
    total = a.warmup + a.rounds * a.steps

    def step(i: int, window: torch.Tensor) -> torch.Tensor:
        return train_step(model, opt, [window], plan=plan, max_grad_norm=1.0, lr=lr_of(i, total)).loss

    info = dict(name=f"yxanul {a.preset} train_step", params=count_parameters(config),
                matmul_params=matmul_parameters(config), flops_per_token=config.flops_per_token(a.seq_length))
    return step, info


ABLATIONS = ("no RoPE", "LayerNorm for RMSNorm", "no RoPE + LayerNorm for RMSNorm")


def ablated(a, kind: str):
    """yxanul's step with architecture pieces swapped while it runs (timing only, a different model):
    RoPE as identity, and/or RMSNorm as torch's fused F.layer_norm (CPU has no fused RMSNorm kernel).
    What is left of the gap to nanoGPT after both is yxanul's own overhead."""
    import torch.nn.functional as F

    import yxanul.models.modeling_torch as mt

    step, info = build_yxanul(a)
    swaps = {}
    if "no RoPE" in kind:
        swaps["apply_rotary"] = lambda x, freqs: x
    if "LayerNorm" in kind:
        swaps["rms_norm"] = lambda x, w, eps: F.layer_norm(x, x.shape[-1:], w, None, eps)

    def run(i: int, window: torch.Tensor) -> torch.Tensor:
        saved = {name: getattr(mt, name) for name in swaps}
        for name, fn in swaps.items():
            setattr(mt, name, fn)
        try:
            return step(i, window)
        finally:
            for name, fn in saved.items():
                setattr(mt, name, fn)

    return run, {**info, "name": f"yxanul {a.preset} train_step, {kind} (ablation)"}


def build_nanogpt(a):
    """(step(i, window) -> loss, row info): nanoGPT's model, configure_optimizers and loop body."""
    cfg = GPTConfig(block_size=a.seq_length, vocab_size=a.vocab_size, n_layer=4, n_head=4, n_embd=256,
                    dropout=0.0, bias=False)
    torch.manual_seed(1337)
    model = GPT(cfg)
    model.train()
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")
    total = a.warmup + a.rounds * a.steps

    def step(i: int, window: torch.Tensor) -> torch.Tensor:
        for group in opt.param_groups:  # nanoGPT sets the scheduled LR every iteration
            group["lr"] = lr_of(i, total)
        w = window.long()
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()  # nanoGPT's get_batch: two int64 (B, T)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    L, C, T = cfg.n_layer, cfg.n_embd, a.seq_length
    info = dict(name="nanoGPT GPT", params=model.get_num_params(non_embedding=False), matmul_params=matmul,
                flops_per_token=6 * matmul + 12 * L * C * T)
    return step, info


def interleaved(models, windows, a) -> list[dict]:
    """Warm-up each, then ``rounds`` x (each model ``steps`` timed steps); per-step seconds and losses."""
    runs = [dict(times=[], losses=[], round_medians=[], i=0) for _ in models]

    def go(k: int, n: int, timed: bool):
        step, r = models[k][0], runs[k]
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            loss = step(r["i"], windows[r["i"] % len(windows)])
            times.append(time.perf_counter() - t0)
            r["losses"].append(float(loss))  # after the clock: the step itself never syncs
            r["i"] += 1
        if timed:
            r["times"] += times
            r["round_medians"].append(statistics.median(times))

    for k in range(len(models)):
        go(k, a.warmup, timed=False)
    for _ in range(a.rounds):
        for k in range(len(models)):
            go(k, a.steps, timed=True)
    return runs


def row_of(info: dict, run: dict, tokens: int) -> dict:
    dt = statistics.median(run["times"])
    tps = tokens / dt
    return {**info, "step_ms": round(dt * 1e3, 2), "step_ms_min": round(min(run["times"]) * 1e3, 2),
            "step_ms_max": round(max(run["times"]) * 1e3, 2),
            "round_tok_per_s": [round(tokens / m, 1) for m in run["round_medians"]],
            "tok_per_s": round(tps, 1), "gflops_per_s": round(tps * info["flops_per_token"] / 1e9, 2),
            "loss_first": round(run["losses"][0], 4), "loss_last": round(run["losses"][-1], 4)}


def train_loop(a) -> list[float]:
    """`yxanul train` at the same shape: its printed tok/sec after the first log line (5-step averages)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "yxanul", "train", "--max_steps", str(a.train_steps), "--seq_length",
               str(a.seq_length), "--micro_batch_size", str(a.micro_batch_size), "--gradient_accumulation_steps",
               "1", "--eval_freq", "0", "--sample_tokens", "0", "--log_freq", "5", "--save_final", "false",
               "--model", a.preset, "--output_dir", tmp]
        cmd[-2:-2] = ["--warmup_steps", str(a.train_steps)] if a.train_steps < 30 else []  # default.yaml: 30
        env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"yxanul train failed (exit {out.returncode}): {' '.join(cmd)}")
    got = [(int(s), float(v)) for s, v in re.findall(r"^step\s+(\d+)\D.*tok/sec: ([\d.]+)", out.stdout, re.M)]
    return [v for s, v in got if s > 5] or [v for _, v in got]


def loop_vs_nanogpt(a, nanogpt_step, windows, flops_per_token: float, nanogpt_flops: float) -> tuple[dict, dict]:
    """``train_runs`` x (one `yxanul train` subprocess, then nanoGPT for as many steps right after): the
    loop cannot share the process, so each run is bracketed by nanoGPT steps timed in the same minute
    (this VM's speed drifts by ~10 % over minutes). Returns (the loop's row, nanoGPT's bracket row)."""
    printed, nano_times = [], []
    for _ in range(a.train_runs):
        printed += train_loop(a)
        for i in range(a.train_steps):
            t0 = time.perf_counter()
            nanogpt_step(i, windows[i % len(windows)])
            if i >= a.warmup:
                nano_times.append(time.perf_counter() - t0)
    tokens = a.micro_batch_size * a.seq_length
    tps = statistics.median(printed)
    loop = {"name": f"yxanul train loop ({a.train_runs} x {a.train_steps} steps, printed tok/sec)",
            "tok_per_s": round(tps, 1), "gflops_per_s": round(tps * flops_per_token / 1e9, 2), "printed": printed}
    nano_tps = tokens / statistics.median(nano_times) if nano_times else float("nan")
    bracket = {"name": "nanoGPT GPT (right after each loop run)", "step_ms": round(tokens / nano_tps * 1e3, 2),
               "tok_per_s": round(nano_tps, 1), "gflops_per_s": round(nano_tps * nanogpt_flops / 1e9, 2)}
    return loop, bracket


def profile(models, windows, folder: Path) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_ctx

    folder.mkdir(parents=True, exist_ok=True)
    for step, info in models[:2]:
        with prof_ctx(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(3):
                step(1000 + i, windows[i % len(windows)])
        name = "yxanul" if info["name"].startswith("yxanul") else "nanogpt"
        (folder / f"profile-{name}.txt").write_text(
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))


def _n(v) -> str:
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def table(rows: list[dict], ratio: dict) -> str:
    lines = ["| run | params | matmul params | FLOPs/token | step ms | tok/s | GFLOP/s |", "|---" * 7 + "|"]
    for r in rows:
        cells = [r.get(k) for k in ("params", "matmul_params", "flops_per_token", "step_ms")]
        lines.append(f"| {r['name']} | " + " | ".join(_n(c) for c in cells)
                     + f" | {r['tok_per_s']:,.1f} | {_n(r.get('gflops_per_s'))} |")
    lines.append("")
    lines += [f"{k}: {v}" for k, v in ratio.items()]
    return "\n".join(lines)


def environment(a) -> dict:
    import platform

    return {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "torch": torch.__version__,
            "python": platform.python_version(), "cpu": _cpu_name(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_before": round(os.getloadavg()[0], 2),
            "seq_length": a.seq_length, "micro_batch_size": a.micro_batch_size, "vocab_size": a.vocab_size,
            "rounds": a.rounds, "steps_per_round": a.steps, "warmup": a.warmup}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def main(argv=None) -> int:
    a = parse(argv)
    torch.set_num_threads(a.threads)
    env = environment(a)
    if env["load_before"] >= 0.5:
        print(f"warning: load average {env['load_before']} >= 0.5: the machine is busy, timings are noisy")
    gen = torch.Generator().manual_seed(1234)
    windows = [torch.randint(0, a.vocab_size, (a.micro_batch_size, a.seq_length + 1), generator=gen)
               .to(torch.uint16 if a.vocab_size <= 65535 else torch.int32) for _ in range(4)]  # the loader's form
    models = [build_yxanul(a), build_nanogpt(a)] + [ablated(a, k) for k in ABLATIONS if a.ablations]
    runs = interleaved(models, windows, a)
    tokens = a.micro_batch_size * a.seq_length
    rows = [row_of(info, run, tokens) for (_, info), run in zip(models, runs)]
    env["load_after_incl_this_run"] = round(os.getloadavg()[0], 2)
    A, B = rows[:2]
    ratio = {"tok/s A/B": round(A["tok_per_s"] / B["tok_per_s"], 3),
             "GFLOP/s A/B (FLOPs-normalised)": round(A["gflops_per_s"] / B["gflops_per_s"], 3)}
    for r in rows[2:]:
        ratio[r["name"].split(", ", 1)[1] + " / B tok/s"] = round(r["tok_per_s"] / B["tok_per_s"], 3)
    if a.profile:
        profile(models, windows, Path(a.profile))
    if a.train_steps:
        loop, bracket = loop_vs_nanogpt(a, models[1][0], windows, A["flops_per_token"], B["flops_per_token"])
        rows += [loop, bracket]
        ratio["yxanul train loop / nanoGPT tok/s (bracketed)"] = round(loop["tok_per_s"] / bracket["tok_per_s"], 3)
    print(f"CPU {env['cpu']} | torch {env['torch']} | threads {env['torch_threads']} | load "
          f"{env['load_before']} (after, with this run: {env['load_after_incl_this_run']})"
          f" | seq {a.seq_length} x micro {a.micro_batch_size}")
    print(table(rows, ratio))
    if a.out:
        Path(a.out).write_text(json.dumps({"env": env, "rows": rows, "ratio": ratio}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
