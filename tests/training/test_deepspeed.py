"""DeepSpeed through `accelerate launch` on CPU with the shipped ds_configs: ZeRO-1 in one process,
ZeRO-2 and ZeRO-3 in two (gloo, DeepSpeed's CPU accelerator).

The first DeepSpeed initialize JIT-builds a shared-memory comm op (~60-90 s on 2 cores); it is
cached in TORCH_EXTENSIONS_DIR (~/.cache/yxanul/torch_extensions) so later runs start in seconds.
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_run import DS_RUN, deepspeed_env
from tiny_run import ds_train as ds

from yxanul.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None or
                                                   shutil.which("accelerate") is None,
                                                   reason="needs deepspeed and the accelerate CLI")]


def plain(*args):
    r = subprocess.run([sys.executable, "-m", "yxanul", "train", *DS_RUN, *args], capture_output=True, text=True,
                       env=deepspeed_env())
    assert r.returncode == 0, r.stderr[-2000:]


def losses(d):
    return {r["step"]: r["loss"] for r in read_metrics(Path(d) / "metrics.jsonl") if "loss" in r}


def test_deepspeed_config_gets_max_grad_norm_and_the_batch_plan(tmp_path):
    """The trainer fills the "auto" values of the shipped ZeRO-1 config itself (yxanul's loader is not
    prepared by accelerate, and accelerate would fill gradient_clipping with 1.0)."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin

    from yxanul.config import parse_args
    from yxanul.training.runtime import configure_deepspeed

    plugin = DeepSpeedPlugin(hf_ds_config=str(ROOT / "ds_configs" / "zero1.json"))
    acc = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin), num_processes=2)
    configure_deepspeed(acc, parse_args(["--max_grad_norm", "0.25"]), micro=3, accum=5, say=print)
    ds_cfg = plugin.deepspeed_config
    assert ds_cfg["gradient_clipping"] == 0.25
    assert (ds_cfg["train_micro_batch_size_per_gpu"], ds_cfg["gradient_accumulation_steps"],
            ds_cfg["train_batch_size"]) == (3, 5, 30)


def test_zero1_trains_like_plain_and_resumes(tmp_path):
    ds("--max_steps", "8", "--checkpoint_freq", "4", "--keep_last", "3", "--output_dir", str(tmp_path / "ds"))
    assert (tmp_path / "ds" / "checkpoints" / "step_4" / "pytorch_model").is_dir()  # DeepSpeed's own format
    plain("--max_steps", "8", "--checkpoint_freq", "0", "--output_dir", str(tmp_path / "plain"))
    a, b = losses(tmp_path / "ds"), losses(tmp_path / "plain")
    assert max(abs(a[s] - b[s]) for s in range(1, 9)) < 1e-4
    # resume the ZeRO-1 checkpoint of step 4 under DeepSpeed
    shutil.copytree(tmp_path / "ds" / "checkpoints" / "step_4", tmp_path / "res" / "checkpoints" / "step_4")
    ds("--max_steps", "8", "--checkpoint_freq", "0", "--output_dir", str(tmp_path / "res"), "--resume", "latest")
    c = losses(tmp_path / "res")
    assert sorted(c) == [5, 6, 7, 8] and max(abs(a[s] - c[s]) for s in c) < 1e-4


def exported_weights(ckpt, out):
    from safetensors.torch import load_file

    r = subprocess.run([sys.executable, "-m", "yxanul", "export", str(ckpt), str(out), "--dtype", "fp32"],
                       capture_output=True, text=True, env=deepspeed_env())
    assert r.returncode == 0, r.stderr[-2000:]
    return load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("stage", [2, 3])
def test_zero2_zero3_two_processes_train_like_plain_resume_and_export(tmp_path, stage):
    """2 CPU processes (micro 2 each) against one plain process with accumulation 2: the same windows per
    optimizer step, fp32 throughout, so only the summation order of the gradient average differs
    (observed ~1e-6 in the loss; 1e-4 as in the ZeRO-1 test leaves room for Adam's early-step
    amplification of it). Each rank writes its own shard (ZeRO-3: parameters and optimizer states),
    all listed in the manifest; a resume at 2 processes continues the same losses; `yxanul export`
    consolidates the shards (DeepSpeed's zero_to_fp32) into the plain run's weights."""
    import json

    run, ref = tmp_path / f"z{stage}", tmp_path / "plain"
    r = ds("--micro_batch_size", "2", "--max_steps", "8", "--checkpoint_freq", "4", "--output_dir", str(run),
           stage=stage, procs=2)
    assert "is deprecated" not in r.stdout + r.stderr  # torch's warning for DeepSpeed's collectives, every step
    plain("--micro_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_steps", "8", "--checkpoint_freq", "8",
          "--output_dir", str(ref))
    a, b = losses(run), losses(ref)
    assert sorted(a) == sorted(b) == list(range(1, 9)) and max(abs(a[s] - b[s]) for s in a) < 1e-4
    files = json.loads((run / "checkpoints" / "step_4" / "manifest.json").read_text())["files"]
    shards = sorted(f for f in files if f.startswith("pytorch_model/"))
    per_rank = ["optim_states"] + (["model_states"] if stage == 3 else [])
    assert all(any(f"zero_pp_rank_{r}_mp_rank_00_{k}" in f for f in shards) for r in (0, 1) for k in per_rank), shards
    if stage == 3:  # resume at the same world size; at another one a single line says what to do
        shutil.copytree(run / "checkpoints" / "step_4", tmp_path / "res" / "checkpoints" / "step_4")
        ds("--micro_batch_size", "2", "--max_steps", "8", "--checkpoint_freq", "0", "--output_dir",
           str(tmp_path / "res"), "--resume", "latest", stage=3, procs=2)
        c = losses(tmp_path / "res")
        assert sorted(c) == [5, 6, 7, 8] and max(abs(a[s] - c[s]) for s in c) < 1e-6  # same processes, same order
        r = ds("--micro_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_steps", "8", "--output_dir",
               str(tmp_path / "res"), "--resume", "latest", stage=3, procs=1, ok=False)
        assert "sharded over 2 processes and DeepSpeed reloads it only at that world size" in r.stdout + r.stderr
    w = exported_weights(run / "checkpoints" / "step_8", tmp_path / "ex")
    v = exported_weights(ref / "checkpoints" / "step_8", tmp_path / "ex_ref")
    # the same summation-order noise in the weights: an element whose gradient is ~0 may take an Adam step
    # of the other sign, at most ~max_lr (2e-3) off; a misassembled shard would be off by a weight (std 0.02)
    diff = [(w[k] - v[k]).abs() for k in sorted(w)]
    assert sorted(w) == sorted(v) and max(d.max().item() for d in diff) < 2e-3
    assert sum(d.sum().item() for d in diff) / sum(d.numel() for d in diff) < 1e-5  # observed 2.6e-7


@pytest.mark.gpu
@pytest.mark.te
@pytest.mark.parametrize("recipe,flags,expect", [
    ("delayed", ["--fp8_margin", "1", "--fp8_amax_history_len", "16"], ["margin=1", "amax_history_len=16"]),
    ("current", [], ["recipe_type=Float8CurrentScaling"]),
])
def test_zero1_fp8_runs_the_configured_recipe(tmp_path, recipe, flags, expect):
    """Under DeepSpeed accelerate ignores TERecipeKwargs (it would wrap with DelayedScaling defaults:
    margin 0, history 1024); the precision report, read back from TE during a forward, must show the
    recipe and values yxanul was configured with."""
    import json

    from yxanul import _te

    ok, why = _te.availability().get(recipe, (False, "unknown"))
    if not ok:
        pytest.skip(f"FP8 recipe {recipe} unavailable here: {why}")
    out = tmp_path / recipe
    ds("--model", "medium", "--backend", "te", "--seq_length", "256", "--max_steps", "4", "--checkpoint_freq", "0",
       "--use_fp8", "--require_fp8", "--fp8_min_gemm_dim", "0", "--fp8_recipe", recipe, *flags, "--output_dir",
       str(out))
    rep = json.loads((out / "precision_report.json").read_text())
    rb = rep["te_readback"]
    assert rep["fp8"] and rb["fp8_confirmed"] and rb["module_recipes"] == [rb["recipe"]]
    assert rb["recipe"] == {"delayed": "DelayedScaling", "current": "Float8CurrentScaling"}[recipe]
    assert all(e in rb["recipe_repr"] for e in expect), rb["recipe_repr"]
    assert all(r["precision"] == "FP8" for r in read_metrics(out / "metrics.jsonl") if "loss" in r)
