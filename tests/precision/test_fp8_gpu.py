"""FP8 on a real GPU with Transformer Engine (skipped elsewhere, with the reason).

Run on a GPU machine with TE: `python -m pytest -m "gpu or te" tests/precision -v`.
"""

import json
import subprocess
import sys

import pytest
import torch

from yxanul import _te

pytestmark = [
    pytest.mark.gpu, pytest.mark.te,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not _te.TE_AVAILABLE, reason=f"needs Transformer Engine ({_te.TE_IMPORT_ERROR})"),
]


def _fp8_ok(recipe="delayed"):
    ok, why = _te.availability().get(recipe, (False, "unknown"))
    if not ok:
        pytest.skip(f"FP8 recipe {recipe} unavailable here: {why}")


def _pair(preset="medium", seq=256):
    from yxanul.models import YxanulForCausalLM, config_from_preset

    torch.manual_seed(0)
    ref = YxanulForCausalLM(config_from_preset(preset, 8192, seq, backend="torch")).cuda()
    te_model = YxanulForCausalLM(config_from_preset(preset, 8192, seq, backend="te")).cuda()
    missing, unexpected = te_model.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    return ref, te_model


def _plan(model, **kw):
    from yxanul.precision import PrecisionArgs, resolve_precision

    kw.setdefault("fp8_min_gemm_dim", 0)  # medium (1024 wide) is below the default policy's threshold
    plan = resolve_precision(PrecisionArgs(use_fp8=True, require_fp8=True, **kw), model.config)
    plan.prepare_model(model)
    return plan


def _step(model, plan, micro=0, seq=256):
    x = torch.randint(0, model.config.vocab_size, (2, seq), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16), plan.forward_context(training=True):
        loss = model(x, labels=x, is_first_microbatch=plan.is_first_microbatch(micro)).loss
    loss.backward()
    return loss


def test_te_backend_has_the_torch_state_dict_names_and_no_pickles():
    ref, te_model = _pair("nano")
    names = lambda m: {k for k in m.state_dict() if not k.endswith("_extra_state")}  # noqa: E731
    assert names(ref) == names(te_model)
    assert all(v.numel() == 0 for k, v in te_model.state_dict().items() if k.endswith("_extra_state"))


def test_same_init_distribution_on_both_backends():
    ref, te_model = _pair("medium")
    from yxanul.models import YxanulForCausalLM, config_from_preset

    fresh = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te"))
    for name in ("model.layers.0.self_attention.layernorm_qkv.query_weight", "model.layers.0.layernorm_mlp.fc2_weight",
                 "model.layers.0.self_attention.proj.weight", "model.layers.0.layernorm_mlp.layer_norm_weight"):
        a, b = ref.state_dict()[name].float(), fresh.state_dict()[name].float()
        assert abs(a.std().item() - b.std().item()) < 0.1 * a.std().item() + 1e-6, name


def test_golden_parity_te_vs_torch_bf16():
    ref, te_model = _pair("medium")
    x = torch.randint(0, 8192, (2, 256), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = ref(x, labels=x), te_model(x, labels=x)
    with torch.no_grad():
        exact = ref(x, labels=x)  # fp32 reference: defines the "bf16 tolerance"
    rel = lambda p, q: ((p.logits.float() - q.logits.float()).norm() / q.logits.float().norm()).item()  # noqa: E731
    bf16_error = rel(a, exact)  # ~1.8e-2 for this preset (CPU measurement)
    assert rel(b, exact) < 1.25 * bf16_error + 2e-3, (rel(b, exact), bf16_error)  # TE no worse than torch bf16
    assert rel(a, b) < 3e-2, rel(a, b)
    assert abs(a.loss.item() - b.loss.item()) < 1e-2


@pytest.mark.parametrize("recipe,cls", [("delayed", "DelayedScaling"), ("current", "Float8CurrentScaling"),
                                        ("block", "Float8BlockScaling"), ("mxfp8", "MXFP8BlockScaling")])
def test_recipe_read_back_from_te(recipe, cls):
    _fp8_ok(recipe)
    from yxanul.models import YxanulForCausalLM, config_from_preset

    model = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te")).cuda().train()
    plan = _plan(model, fp8_recipe=recipe, fp8_format="e4m3" if recipe != "delayed" else "hybrid")
    assert plan.label == "FP8?"
    _step(model, plan)
    rb = plan.readback
    assert rb["fp8_enabled"] and rb["recipe"] == cls and rb["module_recipes"] == [cls]
    assert rb["fp8_format"] == ("E4M3" if recipe != "delayed" else "HYBRID")
    assert rb["layers"]["mlp"] == {"fp8": 24, plan.base: 0} and plan.label == "FP8"


HEADS_128 = {"num_attention_heads": 4, "num_key_value_heads": 4}  # tiny: 512 / 4


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_fp8_attention_runs_the_attention_in_fp8_and_trains_like_bf16_attention(recipe):
    """``fp8_attention``: the recipe TE sees inside the attention carries ``fp8_dpa``; the first attention output
    moves by FP8 rounding (neither 0 nor O(1)) against the same run with BF16 attention (same weights, same batch);
    6 training steps' losses follow that run (each within 5 %, their sum within 2 %) and each batch's falls.
    Current scaling below sm_100: TE 2.20 has no backend for it, refused in one line before anything runs
    (`check_fp8_attention`). The heads are 128 wide (`tiny` with 4 heads): cuDNN's FP8 attention trains no other
    head_dim below sm_100 (64 is refused in one line, the last case)."""
    _fp8_ok(recipe)
    if recipe == "current" and torch.cuda.get_device_capability() < (10, 0):
        from yxanul.errors import ConfigError
        from yxanul.models import YxanulForCausalLM, config_from_preset

        model = YxanulForCausalLM(config_from_preset("tiny", 8192, 256, backend="te", **HEADS_128)).cuda()
        with pytest.raises(ConfigError, match="fp8_attention"):
            _plan(model, fp8_recipe=recipe, fp8_attention=True)
        return
    from yxanul.models import YxanulForCausalLM, config_from_preset
    from yxanul.training.optim import OptimArgs, build_optimizer
    from yxanul.training.step import train_step

    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 8192, (4, 257), generator=gen).cuda() for _ in range(2)]  # packed (B, T + 1)
    runs = {}
    for attention in (False, True):
        _te.reset_fp8_state()
        torch.manual_seed(0)
        model = YxanulForCausalLM(config_from_preset("tiny", 8192, 256, backend="te", **HEADS_128)).cuda().train()
        plan = _plan(model, fp8_recipe=recipe, fp8_attention=attention)
        seen, outs = [], []

        def record(module, args, out, seen=seen, outs=outs):
            seen.append(bool(_te.fp8_state()[1].fp8_dpa))
            outs.append((out[0] if isinstance(out, tuple) else out).detach().float())

        hook = model.model.layers[0].self_attention.core_attention.register_forward_hook(record)
        opt = build_optimizer(model, OptimArgs(max_lr=1e-3, warmup_steps=0))
        losses = [train_step(model, opt, [batches[i % 2]], plan=plan, max_grad_norm=1.0, lr=1e-3).loss.item()
                  for i in range(6)]
        hook.remove()
        runs[attention] = losses, set(seen), outs[0]
    (ref, seen_ref, out_ref), (ours, seen_ours, out) = runs[False], runs[True]
    assert seen_ref == {False} and seen_ours == {True}
    rel = ((out - out_ref).norm() / out_ref.norm()).item()
    assert 1e-4 < rel < 0.2, rel
    # Bounds from the H200 of 2026-11-28 (delayed): one step 2.85 % off, the six 0.8 % in sum. Two runs that part
    # at the first FP8 step wander apart step by step; their sum and each batch's descent stay close.
    assert ours == pytest.approx(ref, rel=0.05) and sum(ours) == pytest.approx(sum(ref), rel=0.02), (ours, ref)
    assert ours[4] < ours[0] and ours[5] < ours[1], ours  # each of the two batches' losses falls
    if torch.cuda.get_device_capability() < (10, 0):
        from yxanul.errors import ConfigError

        model = YxanulForCausalLM(config_from_preset("tiny", 8192, 256, backend="te")).cuda()  # head_dim 64
        with pytest.raises(ConfigError, match="fp8_attention': expected false for head_dim 64"):
            _plan(model, fp8_recipe=recipe, fp8_attention=True)


def test_small_gemm_policy_and_keep_bf16_run_bf16_inside_fp8():
    _fp8_ok()
    from yxanul.models import YxanulForCausalLM, config_from_preset
    from yxanul.precision import precision_report

    model = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te")).cuda().train()
    plan = _plan(model, fp8_keep_bf16=["model.layers.0.*", "*.layers.23.layernorm_mlp"])
    _step(model, plan)
    rep = precision_report(model, plan)
    assert rep["layers_source"] == "te"
    assert rep["base_dtype"] == "bf16"  # an FP8 run's non-FP8 modules run in BF16 on a GPU
    assert rep["layers"]["qkv"] == {"fp8": 23, "bf16": 1, "why": rep["layers"]["qkv"]["why"]}
    assert rep["layers"]["mlp"]["fp8"] == 22 and rep["layers"]["mlp"]["bf16"] == 2
    assert model.model.layers[0].layernorm_mlp.fp8 is False and model.model.layers[1].layernorm_mlp.fp8 is True


def test_eval_is_bf16_unless_fp8_eval():
    _fp8_ok()
    from yxanul.models import YxanulForCausalLM, config_from_preset

    for fp8_eval in (False, True):
        model = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te")).cuda().eval()
        plan = _plan(model, fp8_eval=fp8_eval)
        x = torch.randint(0, 8192, (2, 256), device="cuda")
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16), plan.forward_context(training=False):
            model(x)
        assert model.model.layers[1].layernorm_mlp.fp8 is fp8_eval


def test_fp8_stats_and_state_round_trip(tmp_path):
    _fp8_ok()
    from yxanul.models import YxanulForCausalLM, config_from_preset

    torch.manual_seed(0)
    model = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te")).cuda().train()
    plan = _plan(model)
    for _ in range(3):
        _step(model, plan)
    stats = plan.fp8_stats(model)
    assert stats["tensors"] > 0 and stats["nonfinite"] == 0 and stats["scale_min"] > 0
    plan.save_fp8_state(model, tmp_path)
    other = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te")).cuda().train()
    other.load_state_dict(model.state_dict())  # no NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE needed
    plan2 = _plan(other)
    assert plan2.restore_fp8_state(other, tmp_path, 256) > 0
    a = model.model.layers[5].layernorm_mlp.fp8_meta["scaling_fwd"].scale
    b = other.model.layers[5].layernorm_mlp.fp8_meta["scaling_fwd"].scale
    assert torch.equal(a, b)


@pytest.mark.parametrize("recipe", ["current", "block", "delayed"])
def test_fp8_stats_of_cached_weights_every_recipe(recipe):
    """Stateless recipes log the scales of TE's cached FP8 weights; for current scaling each one is
    448 / amax(W) (E4M3 weights under the hybrid format), checked against the weights themselves."""
    _fp8_ok(recipe)
    from yxanul.models import YxanulForCausalLM, config_from_preset

    torch.manual_seed(0)
    model = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te")).cuda().train()
    plan = _plan(model, fp8_recipe=recipe)
    _step(model, plan, micro=0)  # is_first_microbatch=True: TE caches the FP8 weights
    stats = plan.fp8_stats(model)
    assert stats["weight_tensors"] > 0 and stats["nonfinite"] == 0 and stats["weight_scale_min"] > 0
    if recipe == "current":
        amax = []  # one cached weight per workspace key; split parameters (query/key/value) share one
        for m in model.modules():
            weights = {n: p for n, p in m.named_parameters(recurse=False) if n.endswith("weight") and p.dim() == 2}
            for key in getattr(m, "_fp8_workspaces", None) or {}:
                fc = key.split("_")[0] if key.startswith("fc") else None  # LayerNormMLP: fc1_weight, fc2_weight
                part = [p for n, p in weights.items() if fc is None or n.startswith(fc)]
                amax.append(max(p.detach().abs().max().float().item() for p in part))
        assert stats["weight_tensors"] == len(amax)
        assert stats["weight_scale_min"] == pytest.approx(448.0 / max(amax), rel=1e-2)  # amax of fp32 or bf16 W
        assert stats["weight_scale_max"] == pytest.approx(448.0 / min(amax), rel=1e-2)


def test_fp8_activation_checkpointing_same_grads():
    """TE blocks are checkpointed with TE's checkpoint: the recompute (in backward, outside the
    step's te.autocast) runs in FP8 with the forward's recipe and scales, so gradients match the
    non-checkpointed FP8 step (torch.utils.checkpoint would recompute in BF16)."""
    _fp8_ok()
    from yxanul.models import YxanulForCausalLM, config_from_preset

    _, a = _pair("medium")
    b = YxanulForCausalLM(config_from_preset("medium", 8192, 256, backend="te")).cuda()
    b.load_state_dict(a.state_dict())
    a.train(), b.train()
    b.set_activation_checkpointing(True)
    plan_a, plan_b = _plan(a), _plan(b)
    torch.manual_seed(1)
    x = torch.randint(0, 8192, (2, 256), device="cuda")
    for model, plan in ((a, plan_a), (b, plan_b)):
        with torch.autocast("cuda", dtype=torch.bfloat16), plan.forward_context(training=True):
            loss = model(x, labels=x, is_first_microbatch=True).loss
        loss.backward()
    assert plan_b.readback["fp8_confirmed"]
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        rel = ((pa.grad - pb.grad).norm() / (pa.grad.norm() + 1e-12)).item()
        assert rel < 1e-2, (n, rel)


# -- through the trainer (the CLI) -----------------------------------------------------------------
def _train(tmp, name, *flags):
    out = tmp / name
    cmd = [sys.executable, "-m", "yxanul", "train", "--model", "medium", "--seq_length", "256",
           "--micro_batch_size", "8", "--log_freq", "1", "--eval_freq", "0", "--sample_tokens", "0",
           "--warmup_steps", "10", "--max_lr", "6e-4", "--backend", "te", "--fp8_min_gemm_dim", "0",
           "--output_dir", str(out), *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, r.stdout


def _losses(out):
    from yxanul.tracking import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


@pytest.mark.slow
def test_fp8_50_steps_within_2_percent_of_bf16(tmp_path):
    _fp8_ok()
    bf16, _ = _train(tmp_path, "bf16", "--max_steps", "50")
    fp8, stdout = _train(tmp_path, "fp8", "--max_steps", "50", "--use_fp8", "--require_fp8")
    assert any(line.rstrip().endswith("| FP8") for line in stdout.splitlines())
    a, b = _losses(bf16), _losses(fp8)
    tail = lambda d: sum(d[s] for s in range(41, 51)) / 10  # noqa: E731
    assert abs(tail(a) - tail(b)) / tail(a) < 0.02
    rep = json.loads((fp8 / "precision_report.json").read_text())
    assert rep["fp8"] and rep["layers_source"] == "te" and rep["layers"]["mlp"]["fp8"] == 24
    assert rep["te_readback"]["recipe"] == "DelayedScaling"
    import yaml

    hparams = yaml.safe_load(next((fp8 / "tensorboard").rglob("hparams.yml")).read_text())  # the tracker config
    assert hparams["precision_report/te_readback/recipe"] == "DelayedScaling"
    assert hparams["precision_report/te_readback/fp8_confirmed"] is True
    assert hparams["precision_report/precision"] == "FP8"


@pytest.mark.slow
def test_checkpoints_across_precisions(tmp_path):
    _fp8_ok()
    fp8, _ = _train(tmp_path, "a", "--max_steps", "10", "--use_fp8", "--require_fp8", "--lr_decay_steps", "20")
    ckpt = fp8 / "checkpoints" / "step_10"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["fp8"] and state["fp8_recipe"] == "DelayedScaling"
    assert (ckpt / "fp8_state.safetensors").is_file()
    # FP8 -> BF16 (same run dir, FP8 off), no unsafe-pickle variable anywhere
    _, out = _train(tmp_path, "a", "--max_steps", "12", "--resume", "latest", "--lr_decay_steps", "20")
    assert "precision: FP8 -> BF16" in out
    # FP8 resume matches an uninterrupted FP8 run up to FP8 rounding
    full, _ = _train(tmp_path, "full", "--max_steps", "20", "--use_fp8", "--lr_decay_steps", "20")
    part, _ = _train(tmp_path, "part", "--max_steps", "10", "--use_fp8", "--lr_decay_steps", "20")
    _train(tmp_path, "part", "--max_steps", "20", "--use_fp8", "--lr_decay_steps", "20", "--resume", "latest")
    a, b = _losses(full), _losses(part)
    assert max(abs(a[s] - b[s]) for s in range(11, 21)) < 5e-3
    # BF16 -> FP8
    _train(tmp_path, "b", "--max_steps", "5", "--lr_decay_steps", "20")
    _, out = _train(tmp_path, "b", "--max_steps", "10", "--use_fp8", "--require_fp8", "--resume", "latest",
                    "--lr_decay_steps", "20")
    assert "precision: BF16 -> FP8" in out
