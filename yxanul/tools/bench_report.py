"""What a `yxanul bench` run writes besides its rows: the environment it measured in and the markdown table."""

from __future__ import annotations


def environment(device) -> dict:
    import platform

    import accelerate
    import torch
    import transformers

    from .. import __version__, _te  # torch: --help stays light

    env = {"yxanul": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "transformers": transformers.__version__,
           "accelerate": accelerate.__version__, "transformer_engine": _te.te_version,
           "device": str(device), "device_name": platform.processor() or platform.machine()}
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        env["driver"] = _driver_version()
        env["cudnn"] = _te.cudnn_runtime()  # TE's fused attention (BF16 and FP8) is cuDNN's: its rules vary
        env["cudnn_torch"] = _torch_cudnn(torch)
    return env


def _torch_cudnn(torch) -> str:
    """torch's cuDNN as a string. ``torch.backends.cudnn.version()`` raises where the process already loaded another
    libcudnn (TE loads the system's first): a bench that measured must not die writing down its environment."""
    try:
        return str(torch.backends.cudnn.version())
    except Exception as e:  # noqa: BLE001 - RuntimeError "cuDNN version incompatibility" on such images
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def markdown(rows: list[dict], env: dict) -> str:
    """The table of docs/benchmarks.md (speed-up against the BF16 row of the same preset and seq)."""
    base = {(r["preset"], r["seq_length"]): r["tokens_per_sec"] for r in rows
            if r["precision"] == "bf16" and r["status"] == "ok"}
    head = (f"Device: {env.get('device_name')} (driver {env.get('driver')}), torch {env['torch']}, "
            f"CUDA {env['cuda']}, TE {env['transformer_engine']}, accelerate {env['accelerate']}.\n"
            "MFU is against the dense BF16 peak for every precision.\n\n")
    lines = ["| preset | seq | micro (x accumulation) | precision | FP8 layers | step ms | tokens/s | vs BF16 "
             "| MFU (BF16 peak) "
             "| peak GiB | loss first→last |", "|" + "---|" * 11]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['preset']} | {r['seq_length']} | {r['micro_batch']} | {r['precision']} | "
                         f"{r['status']}: {r['reason']} |||||||")
            continue
        b = base.get((r["preset"], r["seq_length"]))
        vs = f"{r['tokens_per_sec'] / b:.2f}x" if b else "-"
        mfu = f"{100 * r['mfu_bf16_peak']:.1f}%" if r.get("mfu_bf16_peak") is not None else "n/a"
        prec = r["precision"] + (f" ({r['variant']})" if r.get("variant") else "")
        micro = f"{r['micro_batch']} x {r['accumulation']}" if r.get("accumulation", 1) > 1 else r["micro_batch"]
        lines.append(
            f"| {r['preset']} | {r['seq_length']} | {micro} | {prec} | {r['fp8_layers'] or '-'} | "
            f"{r['step_ms']:.1f} | {r['tokens_per_sec']:,.0f} | {vs} | "
            f"{mfu} | {r['peak_memory_gib'] if r['peak_memory_gib'] is not None else '-'} | "
            f"{r['loss_first']:.3f}→{r['loss_last']:.3f} |")
    return head + "\n".join(lines) + "\n"
