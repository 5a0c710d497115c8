"""examples/trainer_fp8.py on CPU: trains, falls back with its one line, saves a model from_pretrained loads;
and (slow) DeepSpeed ZeRO-1 through TrainingArguments(deepspeed="ds_configs/zero1.json")."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "trainer_fp8.py")
# the example script's own flags (its dataclass), for a two-step run
EXAMPLE_FLAGS = ["--max_steps", "2", "--seq_length", "32", "--micro_batch_size", "4"]


def env():
    cache = Path(os.environ.get("YXANUL_CACHE", Path.home() / ".cache" / "yxanul"))
    return dict(os.environ, HF_HUB_OFFLINE="1", TORCH_EXTENSIONS_DIR=str(cache / "torch_extensions"))


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=900, **kw)


def test_example_bad_flag_is_one_line(tmp_path):
    r = run([sys.executable, EXAMPLE, "--max_steps", "many"])
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "max_steps" in r.stderr, r.stderr
    r = run([sys.executable, EXAMPLE, "--deepspeed", str(tmp_path / "none.json")])  # was TrainingArguments' traceback
    assert r.returncode == 2 and r.stderr.strip() == f"error: deepspeed '{tmp_path / 'none.json'}': no such file (a " \
        "DeepSpeed JSON, e.g. ds_configs/zero1.json)", r.stderr


@pytest.mark.slow
def test_example_runs_on_cpu_and_says_why_fp8_is_off(small_data, tmp_path):
    data_dir, _ = small_data
    r = run([sys.executable, EXAMPLE, *EXAMPLE_FLAGS, "--data_dir", str(data_dir), "--output_dir", str(tmp_path)])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("FP8 off: no CUDA device; training in FP32") == 1
    assert "done: 2 steps in FP32" in r.stdout
    assert json.loads((tmp_path / "precision_report.json").read_text())["fallback_reason"] == "no CUDA device"
    from yxanul.models import YxanulForCausalLM

    assert YxanulForCausalLM.from_pretrained(str(tmp_path)).config.model_type == "yxanul"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_example_under_deepspeed_zero1_on_cpu(small_data, tmp_path):
    """One process, ZeRO-1, CPU (the first run JIT-builds DeepSpeed's shm op, cached afterwards)."""
    data_dir, _ = small_data
    cfg = str(ROOT / "ds_configs" / "zero1.json")
    r = run([sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--deepspeed_config_file", cfg,
             "--num_processes", "1", "--num_machines", "1", "--main_process_port", "0", EXAMPLE, "--deepspeed", cfg,
             *EXAMPLE_FLAGS, "--data_dir", str(data_dir), "--output_dir", str(tmp_path)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "done: 2 steps in FP32" in r.stdout
    ckpt = tmp_path / "checkpoint-2"
    assert any(p.is_dir() and p.name.startswith("global_step") for p in ckpt.iterdir())  # DeepSpeed's own format
    from yxanul.models import YxanulForCausalLM

    YxanulForCausalLM.from_pretrained(str(tmp_path))  # save_model gathered the weights
