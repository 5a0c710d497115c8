"""`yxanul verify` on this machine: on CPU it reports FP8 unavailable and exits 0 unless --require_fp8."""

import json
import subprocess
import sys

import pytest
import torch

from yxanul import _te
from yxanul.tools.verify import main

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")


@cpu_only
def test_verify_on_cpu_exits_0(capsys, monkeypatch):
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    monkeypatch.setenv("NVTE_SOMETHING", "x")
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "[INFO] fp8 recipe delayed" in out
    assert "[WARN] env NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE" in out and "env NVTE_SOMETHING" in out
    assert "precision report for --model yxanul-0.6b" in out and "FP8 requested but off: no CUDA device" in out
    last = out.rstrip().splitlines()[-1]
    assert "all requirements met" not in out and last.startswith("FP8 unavailable here (missing: a CUDA GPU with "
                                                                 "compute capability >= 8.9")
    assert ("Transformer Engine" in last) != _te.TE_AVAILABLE and "--require_fp8` exits 1 here" in last


@cpu_only
def test_verify_require_fp8_json_exits_1(capsys):
    assert main(["--require_fp8", "--json", "--fp8_recipe", "current"]) == 1
    out = json.loads(capsys.readouterr().out)
    failed = {r["check"] for r in out["checks"] if r["status"] == "FAIL"}
    assert failed >= {"gpu", "fp8 recipe current", "fp8 in a yxanul-0.6b forward"}
    assert "fp8 recipe delayed" not in failed  # only the requested recipe is a requirement
    te_row = next(r for r in out["checks"] if r["check"] == "transformer_engine")
    assert te_row["status"] == ("PASS" if _te.TE_AVAILABLE else "FAIL")
    rep = out["precision_report"]
    mlp = rep["layers"]["mlp"]
    assert mlp["fp8"] == 0 and mlp[rep["base_dtype"]] == 21 and mlp["why"] == rep["fallback_reason"]
    assert out["failed"] == len(failed)


def test_verify_unknown_model_is_a_config_error():
    from yxanul.errors import ConfigError

    with pytest.raises(ConfigError, match="model"):
        main(["--model", "nope"])


@cpu_only
def test_verify_cli_exit_codes():
    r = subprocess.run([sys.executable, "-m", "yxanul", "verify"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "yxanul", "verify", "--require_fp8"], capture_output=True, text=True)
    assert r.returncode == 1 and "failed: gpu, " in r.stdout.splitlines()[-1]


def _fake_te_plan(model, require_fp8=False):
    """A plan that decided FP8 for every policy module (the decision itself needs TE: set by hand)."""
    from yxanul.precision import PrecisionArgs
    from yxanul.precision.plan import PrecisionPlan
    from yxanul.precision.policy import policy_modules

    plan = PrecisionPlan.__new__(PrecisionPlan)
    plan.__dict__.update(args=PrecisionArgs(use_fp8=True, require_fp8=require_fp8), fp8_enabled=True, base="bf16",
                         recipe_name="DelayedScaling", readback=None,
                         decisions={n: (k, True, "policy") for n, k, _ in policy_modules(model)})
    return plan


def test_te_readback_hooks_through_a_fake_te_state(monkeypatch, tiny_config):
    """What verify's "fp8 in a forward" and the trainer's precision report read: the hooks record TE's
    global FP8 state and each module's own fp8 flag/recipe during the first TRAINING forward, then
    remove themselves. TE is replaced by a stand-in with TE's attributes (module.fp8, fp8_meta,
    _te.fp8_state()); eval forwards record nothing."""
    from types import SimpleNamespace

    from yxanul.errors import UserError
    from yxanul.models import YxanulForCausalLM
    from yxanul.precision.policy import policy_modules
    from yxanul.precision.report import install_readback

    class DelayedScaling:  # the class name is what the read-back reports
        fp8_format = SimpleNamespace(name="HYBRID")

    class Float8CurrentScaling(DelayedScaling):
        pass

    monkeypatch.setattr(_te, "fp8_state", lambda: (True, DelayedScaling()))
    model = YxanulForCausalLM(tiny_config())
    mods = list(policy_modules(model))
    for _, _, m in mods:
        m.fp8, m.fp8_meta = True, {"recipe": DelayedScaling()}
    mods[0][2].fp8 = False  # TE ran one planned module in BF16
    plan = _fake_te_plan(model)
    install_readback(plan, model)
    x = torch.randint(0, 1000, (1, 16))
    model.eval()
    model(x, shift_labels=x)
    assert plan.readback is None  # eval forwards are not what training runs
    model.train()
    model(x, shift_labels=x)
    rb = plan.readback
    assert (rb["fp8_enabled"], rb["recipe"], rb["fp8_format"], rb["module_recipes"]) == \
        (True, "DelayedScaling", "HYBRID", ["DelayedScaling"])
    assert rb["fp8_modules"] == len(mods) - 1 and rb["fp8_modules_planned"] == len(mods) and rb["fp8_confirmed"]
    assert rb["layers"][mods[0][1]]["bf16"] == 1
    assert all(not m._forward_hooks and not m._forward_pre_hooks for _, _, m in mods)  # removed after one forward
    # a module that ran another recipe is not confirmed; with require_fp8 that is a one-line error
    model2 = YxanulForCausalLM(tiny_config())
    mods2 = list(policy_modules(model2))
    for _, _, m in mods2:
        m.fp8, m.fp8_meta = True, {"recipe": DelayedScaling()}
    mods2[-1][2].fp8_meta = {"recipe": Float8CurrentScaling()}
    plan2 = _fake_te_plan(model2, require_fp8=True)
    install_readback(plan2, model2)
    with pytest.raises(UserError, match=r"require_fp8: TE ran \d+/\d+ planned FP8 modules"):
        model2(x, shift_labels=x)
    assert not plan2.readback["fp8_confirmed"]
