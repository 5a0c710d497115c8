"""FP8 on a real GPU with Transformer Engine (skipped elsewhere with the reason).

Run on the device machine: `python -m pytest -m "gpu or te" -v` (scripts/device/README.md).
"""

import json
import subprocess
import sys

import pytest
import torch

from yxanul.tracking import read_metrics

pytestmark = [pytest.mark.gpu, pytest.mark.te]


def _pair(preset="medium", seq=256):
    from yxanul.models import YxanulForCausalLM, config_from_preset

    torch.manual_seed(0)
    ref = YxanulForCausalLM(config_from_preset(preset, 8192, seq, backend="torch")).cuda()
    te_model = YxanulForCausalLM(config_from_preset(preset, 8192, seq, backend="te")).cuda()
    missing, unexpected = te_model.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    return ref, te_model


def test_te_backend_has_the_torch_state_dict_names():
    ref, te_model = _pair("tiny")
    names = lambda m: {k for k in m.state_dict() if not k.endswith("_extra_state")}  # noqa: E731
    assert names(ref) == names(te_model)


def test_golden_parity_te_vs_torch_bf16():
    ref, te_model = _pair("medium")
    x = torch.randint(0, 8192, (2, 256), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = ref(x, labels=x), te_model(x, labels=x)
    rel = ((a.logits.float() - b.logits.float()).norm() / a.logits.float().norm()).item()
    assert rel < 2e-2, rel
    assert abs(a.loss.item() - b.loss.item()) < 1e-2


@pytest.mark.parametrize("recipe,cls", [("delayed", "DelayedScaling"), ("current", "Float8CurrentScaling")])
def test_recipe_read_back_from_te(recipe, cls):
    from yxanul.models import YxanulForCausalLM, config_from_preset
    from yxanul.precision import PrecisionArgs, resolve_precision

    model = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te")).cuda().train()
    plan = resolve_precision(PrecisionArgs(use_fp8=True, fp8_recipe=recipe, fp8_format="hybrid"), model.config)
    plan.prepare_model(model)
    x = torch.randint(0, 8192, (2, 256), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16), plan.forward_context(training=True):
        model(x, labels=x).loss.backward()
    assert plan.readback["fp8_enabled"] and plan.readback["recipe"] == cls
    assert plan.label == "FP8"


def _train(tmp, name, *flags):
    out = tmp / name
    cmd = [sys.executable, "-m", "yxanul", "train", "--model", "medium", "--seq_length", "256",
           "--micro_batch_size", "8", "--log_freq", "1", "--eval_freq", "0", "--sample_tokens", "0",
           "--warmup_steps", "10", "--max_lr", "6e-4", "--backend", "te", "--output_dir", str(out), *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, r.stdout


def _losses(out):
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


def test_fp8_50_steps_within_2_percent_of_bf16(tmp_path):
    bf16, _ = _train(tmp_path, "bf16", "--max_steps", "50")
    fp8, stdout = _train(tmp_path, "fp8", "--max_steps", "50", "--use_fp8", "--require_fp8")
    assert "| FP8" in stdout.splitlines()[-3] or any(line.endswith("| FP8") for line in stdout.splitlines())
    a, b = _losses(bf16), _losses(fp8)
    tail = lambda d: sum(d[s] for s in range(41, 51)) / 10  # noqa: E731
    assert abs(tail(a) - tail(b)) / tail(a) < 0.02
    rep = json.loads((fp8 / "precision_report.json").read_text())
    assert rep["fp8"] and rep["layers"]["mlp"]["fp8"] == 24


def test_checkpoints_across_precisions(tmp_path):
    fp8, _ = _train(tmp_path, "a", "--max_steps", "10", "--use_fp8", "--require_fp8", "--lr_decay_steps", "20")
    state = json.loads((fp8 / "checkpoints" / "step_10" / "trainer_state.json").read_text())
    assert state["fp8"] and state["fp8_recipe"] == "DelayedScaling"
    assert (fp8 / "checkpoints" / "step_10" / "fp8_state.safetensors").is_file()
    # FP8 -> BF16 (same run dir, FP8 off) and FP8 -> torch backend
    _, out = _train(tmp_path, "a", "--max_steps", "12", "--resume", "latest", "--lr_decay_steps", "20")
    assert "precision: FP8 -> BF16" in out
    # FP8 resume is exact up to FP8 rounding vs an uninterrupted FP8 run
    full, _ = _train(tmp_path, "full", "--max_steps", "20", "--use_fp8", "--lr_decay_steps", "20")
    part, _ = _train(tmp_path, "part", "--max_steps", "10", "--use_fp8", "--lr_decay_steps", "20")
    _train(tmp_path, "part", "--max_steps", "20", "--use_fp8", "--lr_decay_steps", "20", "--resume", "latest")
    a, b = _losses(full), _losses(part)
    assert max(abs(a[s] - b[s]) for s in range(11, 21)) < 5e-3
    # BF16 -> FP8
    bf, _ = _train(tmp_path, "b", "--max_steps", "5", "--lr_decay_steps", "10")
    _, out = _train(tmp_path, "b", "--max_steps", "10", "--use_fp8", "--require_fp8", "--resume", "latest",
                    "--lr_decay_steps", "10")
    assert "precision: BF16 -> FP8" in out
