"""`yxanul verify`: is FP8 possible on this machine, and does it work? (the seeds' verify_fp8.py)

Each line is PASS, FAIL, WARN or INFO. The exit code is 1 when a requirement fails: always for a
broken install, and for FP8 being unavailable only with --require_fp8. Works on a CPU machine
(reports FP8 unavailable, exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import torch

# NVTE_* variables worth knowing about, with what yxanul advises.
ENV_ADVICE = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "only TE tensor/sequence-parallel comm-GEMM overlap needs 1; plain DDP/ZeRO-1 gains nothing",
    "NVTE_FUSED_ATTN": "cuDNN fused attention (default on for Hopper); 0 disables it and is slower",
    "NVTE_FLASH_ATTN": "flash-attention backend inside TE; leave unset unless debugging",
    "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE": "not needed by yxanul (its checkpoints load FP8 state without it); avoid for untrusted files",
    "NVTE_FP8_DPA_BWD": "FP8 attention backward; only with fp8_dpa recipes",
    "NVTE_DEBUG": "TE debug logging; slows training",
}


def _line(rows, status, name, detail):
    rows.append({"status": status, "check": name, "detail": detail})


def collect(require_fp8: bool = False, gemm: bool = True) -> list[dict]:
    from . import _te
    from .precision import PrecisionArgs, probe_facts

    rows: list[dict] = []
    _line(rows, "INFO", "python", platform.python_version())
    _line(rows, "INFO", "torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    try:
        import accelerate

        _line(rows, "PASS", "accelerate", accelerate.__version__)
    except Exception as e:  # noqa: BLE001
        _line(rows, "FAIL", "accelerate", f"not importable: {e}")
    facts = probe_facts()
    if facts.cuda_available:
        cc = ".".join(map(str, facts.compute_capability))
        ok = tuple(facts.compute_capability) >= (8, 9)
        _line(rows, "PASS" if ok else ("FAIL" if require_fp8 else "WARN"), "gpu",
              f"{facts.device_name}, compute capability {cc}" + ("" if ok else " (< 8.9: no FP8 tensor cores)"))
    else:
        _line(rows, "FAIL" if require_fp8 else "INFO", "gpu", "no CUDA device: FP8 unavailable, training runs on CPU in FP32")
    if _te.TE_AVAILABLE:
        _line(rows, "PASS", "transformer_engine", str(_te.te_version))
    else:
        _line(rows, "FAIL" if require_fp8 else "INFO", "transformer_engine", f"not importable: {_te.TE_IMPORT_ERROR}")
    for recipe in ("delayed", "current", "block", "mxfp8"):
        ok, why = facts.recipes.get(recipe, (False, "needs a CUDA device and TE"))
        status = "PASS" if ok else ("FAIL" if require_fp8 and recipe == "delayed" else "INFO")
        _line(rows, status, f"fp8 recipe {recipe}", "available" if ok else f"unavailable: {why}")
    _line(rows, "INFO", "accelerate fp8 backend", _accelerate_backend())
    for var, advice in ENV_ADVICE.items():
        if var in os.environ:
            _line(rows, "INFO", f"env {var}", f"={os.environ[var]}: {advice}")
    for var in sorted(v for v in os.environ if v.startswith("NVTE_") and v not in ENV_ADVICE):
        _line(rows, "INFO", f"env {var}", f"={os.environ[var]}")
    if gemm and facts.cuda_available and _te.TE_AVAILABLE and facts.recipes.get("delayed", (False,))[0]:
        rows.append(_gemm_check(_te, PrecisionArgs()))
    return rows


def _accelerate_backend() -> str:
    """What `Accelerator(mixed_precision="fp8")` would pick without an explicit backend."""
    try:
        from accelerate.utils import is_msamp_available, is_torchao_available, is_transformer_engine_available
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"
    if is_torchao_available():
        return "AO (torchao is installed and auto-detection prefers it) — yxanul passes TERecipeKwargs, so TE is used"
    if is_transformer_engine_available():
        return "TE"
    if is_msamp_available():
        return "MSAMP"
    return "none (accelerate would raise for mixed_precision=fp8; yxanul falls back to BF16 before that)"


def _gemm_check(_te, args) -> dict:  # pragma: no cover - GPU only
    from .precision.plan import build_recipe

    torch.manual_seed(0)
    layer = _te.te.Linear(1024, 1024, bias=False, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), layer.weight.float())
    with torch.no_grad(), _te.autocast(enabled=True, recipe=build_recipe(args)):
        for _ in range(3):  # delayed scaling needs a few steps of amax history
            y = layer(x, is_first_microbatch=None)
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    ok = rel < 0.1
    return {"status": "PASS" if ok else "FAIL", "check": "fp8 gemm",
            "detail": f"1024x1024 te.Linear under FP8 (delayed, HYBRID) vs FP32 reference: relative error {rel:.4f}"}


def model_report(preset: str, recipe: str, seq_length: int = 256) -> dict:
    """The training precision report for ``preset`` with ``--use_fp8``: on a GPU with TE, one real
    forward/backward under the plan so the recipe and format are read back from TE."""
    from .models import YxanulForCausalLM, config_from_preset
    from .precision import PrecisionArgs, precision_report, resolve_precision

    args = PrecisionArgs(use_fp8=True, fp8_recipe=recipe)
    cfg = config_from_preset(preset, 50257, seq_length, backend="auto")
    from .models.modeling_yxanul import resolve_backend

    cfg.backend = resolve_backend("auto")
    plan = resolve_precision(args, cfg, say=lambda *a: None)
    if plan.fp8_enabled:  # pragma: no cover - GPU only
        model = YxanulForCausalLM(cfg).cuda().train()
        plan.prepare_model(model)
        x = torch.randint(0, cfg.vocab_size, (2, seq_length), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16), plan.forward_context(training=True):
            loss = model(x, labels=x).loss
        loss.backward()
    else:
        with torch.device("meta"):
            model = YxanulForCausalLM(cfg)
    return precision_report(model, plan)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="yxanul verify", description=__doc__.split("\n\n")[0])
    p.add_argument("--require_fp8", action="store_true", help="fail (exit 1) unless FP8 works here")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--model", default="medium", help="preset whose FP8 precision report to show (default: medium)")
    p.add_argument("--fp8_recipe", default="delayed", choices=["delayed", "current", "block", "mxfp8"])
    a = p.parse_args(argv)
    from .models import PRESETS
    from .precision import format_report

    if a.model not in PRESETS:
        from .errors import ConfigError

        raise ConfigError("model", "one of " + ", ".join(PRESETS), a.model)
    rows = collect(require_fp8=a.require_fp8)
    report = model_report(a.model, a.fp8_recipe)
    rb = report.get("te_readback") or {}
    if report["fp8"]:
        ok = bool(rb.get("fp8_enabled"))
        rows.append({"status": "PASS" if ok else "FAIL", "check": f"fp8 in a {a.model} forward",
                     "detail": f"TE read back: fp8={rb.get('fp8_enabled')} recipe={rb.get('recipe')} "
                               f"format={rb.get('fp8_format')}"})
    if a.json:
        print(json.dumps({"checks": rows, "precision_report": report}, indent=2, default=str))
    else:
        for r in rows:
            print(f"[{r['status']:<4}] {r['check']:<26} {r['detail']}")
        print(f"precision report for --model {a.model} --use_fp8 --fp8_recipe {a.fp8_recipe}:")
        print(format_report(report))
    failed = [r for r in rows if r["status"] == "FAIL"]
    if not a.json:
        print(f"{len(failed)} failed" if failed else "all requirements met")
    return 1 if failed else 0
