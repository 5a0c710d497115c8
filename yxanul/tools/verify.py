"""`yxanul verify`: is FP8 possible on this machine, and does it work?

Each line is PASS, FAIL, WARN or INFO. The exit code is 1 when a requirement fails: always for a
broken install (accelerate not importable, an FP8 GEMM that errs or is wrong), and for FP8 being
unavailable only with --require_fp8 (as in `yxanul train`: --use_fp8 falls back, --require_fp8
refuses), so a gate for an FP8 run is `yxanul verify --require_fp8`. The last line says which:
what failed, "all requirements met: FP8 (recipe) works here", or "FP8 unavailable here (missing:
...)" on a machine where nothing is broken but FP8 cannot run (a CPU: exit 0).
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from typing import Literal

import torch

from .. import _te
from ..errors import ConfigError
from ..flags import parse_command, same_as
from ..models import YxanulForCausalLM, config_from_preset, resolve_backend
from ..models.presets import PRESETS
from ..precision import build_recipe, format_report, precision_report, probe_facts, resolve_precision
from ..precision.args import PrecisionArgs
from ..training.step import train_step

RECIPES = ("delayed", "current", "block", "mxfp8")

# Environment variables worth knowing about: (status when set, advice).
ENV_ADVICE = {
    "CUDA_DEVICE_MAX_CONNECTIONS": ("WARN", "=1 is only needed for TE tensor/sequence-parallel comm-GEMM overlap; "
                                    "with DDP/ZeRO-1 it serializes kernel queues and can hurt overlap: unset it"),
    "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE": ("WARN", "lets TE unpickle checkpoint extra state (can run code); yxanul "
                                             "checkpoints never need it: unset it unless loading a trusted "
                                             "foreign one"),
    "NVTE_BACKWARD_OVERRIDE": ("WARN", "read when TE is imported; DelayedScaling asserts it is unset (recipe "
                                       "construction fails), other recipes change their backward precision"),
    "NVTE_APPLY_QK_LAYER_SCALING": ("WARN",
                                    "scales attention by layer_number (unfused backend only): breaks TE/torch parity"),
    "NVTE_FUSED_ATTN": ("INFO", "0 disables cuDNN fused attention (TE's default on Hopper, ~1.35x per layer)"),
    "NVTE_FLASH_ATTN": ("INFO", "flash-attention backend choice inside TE; leave unset unless debugging"),
    "NVTE_UNFUSED_FP8_UPDATE": ("INFO", "1 = Python amax/scale update instead of the fused kernel (slower)"),
    "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES": ("INFO", "changes Float8CurrentScaling defaults at import"),
    "NVTE_FP8_BLOCK_SCALING_FP32_SCALES": ("INFO", "changes Float8BlockScaling defaults at import"),
    "NVTE_NORM_FWD_USE_CUDNN": ("INFO", "1 = cuDNN's RMSNorm forward kernels; use --norm_kernel cudnn, which sets both "
                                        "switches (a model asking for TE's kernels is refused while it is set)"),
    "NVTE_NORM_BWD_USE_CUDNN": ("INFO", "1 = cuDNN's RMSNorm backward kernels; see NVTE_NORM_FWD_USE_CUDNN"),
    "NVTE_DEBUG": ("INFO", "TE debug logging; slows training"),
    "ACCELERATE_MIXED_PRECISION": ("INFO", "yxanul passes mixed_precision to Accelerator itself (this is ignored); "
                                           "FP8 comes from --use_fp8"),
    "ACCELERATE_FP8_BACKEND": ("WARN", "=TE makes accelerate.prepare() run convert_model and wrap forward in its own "
                                       "fp8_autocast even under bf16; yxanul removes the wrapper (after_prepare)"),
}


def _row(rows, status, name, detail):
    rows.append({"status": status, "check": name, "detail": detail})


def collect(require_fp8: bool = False, recipe: str = "delayed", gemm: bool = True) -> list[dict]:
    rows: list[dict] = []
    need = "FAIL" if require_fp8 else "INFO"
    _row(rows, "INFO", "python", platform.python_version())
    _row(rows, "INFO", "torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    try:
        import accelerate

        _row(rows, "PASS", "accelerate", accelerate.__version__)
    except Exception as e:  # noqa: BLE001
        _row(rows, "FAIL", "accelerate", f"not importable: {e}")
    facts = probe_facts()
    if facts.cuda_available:
        cc = ".".join(map(str, facts.compute_capability))
        ok = tuple(facts.compute_capability) >= (8, 9)
        _row(rows, "PASS" if ok else ("FAIL" if require_fp8 else "WARN"), "gpu",
             f"{facts.device_name}, compute capability {cc}" + ("" if ok else " (< 8.9: no FP8 tensor cores)"))
    else:
        _row(rows, need, "gpu", "no CUDA device: FP8 unavailable, training runs in FP32 on CPU")
    if _te.TE_AVAILABLE:
        _row(rows, "PASS", "transformer_engine", str(_te.te_version))
    else:
        installed = f" (installed: {_te.te_installed_version})" if _te.te_installed_version else ""
        _row(rows, need, "transformer_engine", f"not importable{installed}: {_te.TE_IMPORT_ERROR}")
    for r in RECIPES:
        ok, why = facts.recipes.get(r, (False, "needs a CUDA device" + ("" if _te.TE_AVAILABLE else " and TE")))
        status = "PASS" if ok else ("FAIL" if require_fp8 and r == recipe else "INFO")
        _row(rows, status, f"fp8 recipe {r}", "available" if ok else f"unavailable: {why}")
    _row(rows, "INFO", "accelerate fp8 backend", _accelerate_backend())
    for var, (status, advice) in ENV_ADVICE.items():
        if var in os.environ:
            _row(rows, status, f"env {var}", f"={os.environ[var]}: {advice}")
    for var in sorted(v for v in os.environ if v.startswith("NVTE_") and v not in ENV_ADVICE):
        _row(rows, "INFO", f"env {var}", f"={os.environ[var]}")
    if gemm and facts.cuda_available and _te.TE_AVAILABLE:
        for r in RECIPES:
            if facts.recipes.get(r, (False,))[0]:
                rows.append(_gemm_check(_te, r))
    return rows


def _accelerate_backend() -> str:
    """What `Accelerator(mixed_precision="fp8")` would pick with no recipe handler (accelerator.py
    __init__: AO if torchao is installed, else TE, else MSAMP, else ImportError). Its checks only
    look for installed packages (find_spec), they do not import them."""
    try:
        from accelerate.utils import is_msamp_available, is_torchao_available, is_transformer_engine_available
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"
    pick = ("AO (torchao installed; auto-detection prefers it)" if is_torchao_available() else
            "TE" if is_transformer_engine_available() else "MSAMP" if is_msamp_available() else
            "none (mixed_precision=fp8 would raise)")
    return (f"{pick} by auto-detection; not used by yxanul, whose FP8 plans pass TERecipeKwargs "
            "(backend TE, recipe read back in the precision report)")


def _gemm_check(_te, recipe: str) -> dict:  # pragma: no cover - GPU only
    """A 1024x1024 te.Linear under te.autocast(recipe) vs the same layer in BF16: relative error, and
    whether TE itself ran it in FP8 (module.fp8)."""
    name = f"fp8 gemm {recipe}"
    try:
        torch.manual_seed(0)
        layer = _te.te.Linear(1024, 1024, bias=False, params_dtype=torch.bfloat16, device="cuda")
        x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            ref = layer(x).float()
        for _ in range(3):  # grad enabled: TE updates delayed scales only then (autocast_exit)
            with _te.autocast(enabled=True, recipe=build_recipe(PrecisionArgs(fp8_recipe=recipe))):
                y = layer(x).detach().float()
        ran_fp8 = bool(getattr(layer, "fp8", False))
        rel = ((y - ref).norm() / ref.norm()).item()
    except Exception as e:  # noqa: BLE001
        return {"status": "FAIL", "check": name, "detail": f"{type(e).__name__}: {e}"}
    ok = ran_fp8 and rel < 0.1 and (y != ref).any().item()
    return {"status": "PASS" if ok else "FAIL", "check": name,
            "detail": f"te.Linear 256x1024x1024 FP8 vs BF16: relative error {rel:.4f}, TE module.fp8={ran_fp8}"}


def model_report(preset: str, recipe: str, seq_length: int = 256) -> dict:
    """The precision report for ``preset`` with --use_fp8: on a GPU with TE, one real training
    forward/backward under the plan so recipe and format are read back from TE."""
    cfg = config_from_preset(preset, 50257, seq_length, backend=resolve_backend("auto"))
    plan = resolve_precision(PrecisionArgs(use_fp8=True, fp8_recipe=recipe), cfg, say=lambda *a: None)
    if plan.fp8_enabled:  # pragma: no cover - GPU only
        model = YxanulForCausalLM(cfg).cuda().train()
        plan.prepare_model(model, say=lambda *a: None)
        x = torch.randint(0, cfg.vocab_size, (2, seq_length), device="cuda")  # (B, T)
        train_step(model, None, [(x, x)], plan=plan)  # the trainer's step, forward/backward only
    else:
        with torch.device("meta"):
            model = YxanulForCausalLM(cfg)
        plan.prepare_model(model, say=lambda *a: None)
    return precision_report(model, plan)


@dataclass
class VerifyCommand:
    """Check the FP8 stack (GPU, CUDA, TE, accelerate)."""

    require_fp8: bool = same_as(PrecisionArgs, "require_fp8")
    json: bool = field(default=False, metadata={"help": "Print JSON instead of a table."})
    model: str = field(default="yxanul-0.6b", metadata={
        "help": "Preset whose FP8 precision report to show (yxanul-0.6b: the smallest preset whose layers pass "
                "the default small-GEMM policy)."})
    fp8_recipe: Literal["delayed", "current", "block", "mxfp8"] = same_as(PrecisionArgs, "fp8_recipe")

    def __post_init__(self):
        if self.model not in PRESETS:
            raise ConfigError("model", "one of " + ", ".join(PRESETS), self.model)


def main(argv: list[str] | None = None) -> int:
    a = parse_command(VerifyCommand, argv, prog="yxanul verify", description=__doc__.split("\n\n")[0])
    rows = collect(require_fp8=a.require_fp8, recipe=a.fp8_recipe)
    report = model_report(a.model, a.fp8_recipe)
    rb = report.get("te_readback") or {}
    if report["fp8"]:
        ok = bool(rb.get("fp8_confirmed"))
        _row(rows, "PASS" if ok else "FAIL", f"fp8 in a {a.model} forward",
             f"TE read back: fp8={rb.get('fp8_enabled')} recipe={rb.get('recipe')} format={rb.get('fp8_format')} "
             f"modules {rb.get('fp8_modules')}/{rb.get('fp8_modules_planned')}")
    elif a.require_fp8:
        _row(rows, "FAIL", f"fp8 in a {a.model} forward", f"off: {report['fallback_reason']}")
    failed = [r for r in rows if r["status"] == "FAIL"]
    if a.json:
        print(json.dumps({"checks": rows, "precision_report": report, "failed": len(failed)}, indent=2, default=str))
    else:
        for r in rows:
            print(f"[{r['status']:<4}] {r['check']:<26} {r['detail']}")
        print(f"precision report for --model {a.model} --use_fp8 --fp8_recipe {a.fp8_recipe}:")
        print(format_report(report))
        print(summary_line(rows, a.fp8_recipe, report))
    return 1 if failed else 0


def summary_line(rows: list[dict], recipe: str, report: dict) -> str:
    """The last line: what failed, else whether FP8 itself is usable here (never "met" when it is not)."""
    failed = [r["check"] for r in rows if r["status"] == "FAIL"]
    if failed:
        return f"{len(failed)} failed: {', '.join(failed)}"
    if report.get("fp8"):
        return f"all requirements met: FP8 ({recipe}) works here"
    status = {r["check"]: r for r in rows}
    needs = (("gpu", "a CUDA GPU with compute capability >= 8.9"), ("transformer_engine", "Transformer Engine"))
    missing = [what for check, what in needs if status[check]["status"] != "PASS"]
    if not missing:
        missing = [f"fp8 recipe {recipe}: {status[f'fp8 recipe {recipe}']['detail']}"]
    return (f"FP8 unavailable here (missing: {'; '.join(missing)}): --use_fp8 falls back to "
            f"{report.get('base_dtype', 'BF16').upper()}, --require_fp8 refuses to train; nothing is broken (exit 0; "
            "`yxanul verify --require_fp8` exits 1 here)")
