"""Tracking helpers: the GPU peak table and the one FLOPs/token behind MFU, the fixed console line,
the tracker settings passed explicitly (no WANDB_* environment writes) and the W&B run id."""

import os

import pytest

from yxanul.tracking import (
    TrackingArgs,
    flat_tracker_config,
    format_duration,
    format_eval_line,
    format_step_line,
    mfu,
    peak_flops,
    progress,
    tracker_init_kwargs,
    tracker_names,
    wandb_run_id,
)


@pytest.mark.parametrize("name,key", [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                                      ("NVIDIA H200", "H200"), ("NVIDIA H200 NVL", "H200 NVL"),
                                      ("NVIDIA GH200 480GB", "GH200"),
                                      ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"),
                                      ("NVIDIA A100-SXM4-80GB", "A100")])
def test_peak_flops_picks_the_most_specific_gpu_name(name, key):
    assert peak_flops(name)[0] == key


def test_unknown_gpu_and_cpu_have_no_peak():
    assert peak_flops(None) is None and peak_flops("NVIDIA GeForce GTX 1080") is None


def test_flops_per_token_is_seq_length_aware_and_mfu_uses_it(tiny_config):
    from yxanul.models.configuration_yxanul import matmul_parameters

    cfg = tiny_config()
    L, C = cfg.num_hidden_layers, cfg.hidden_size
    assert cfg.flops_per_token(1024) == 6 * matmul_parameters(cfg) + 12 * L * C * 1024
    assert cfg.flops_per_token(512) < cfg.flops_per_token(1024)  # a shorter curriculum stage: less attention
    assert cfg.flops_per_token() == cfg.flops_per_token(cfg.max_position_embeddings)
    assert mfu(1e9, 1000.0, ("H100", 989e12), 2) == pytest.approx(1e12 / (2 * 989e12))
    assert mfu(1e9, 1000.0, None, 1) is None


def test_step_line_shape_and_penalty_columns():
    line = format_step_line(250, 0, 3.456789, 6e-4, 0.8234, 156.78, 3345.67, "BF16")
    assert line == ("step  250 | epoch 0 | loss: 3.456789 | lr: 6.00e-04 | norm: 0.8234 | dt: 156.78ms | "
                    "tok/sec: 3345.67 | BF16")
    line = format_step_line(250, 0, 3.456789, 6e-4, 0.8234, 156.78, 3345.67, "BF16", max_steps=300)
    assert line == ("step  250/300 83% eta 8s | epoch 0 | loss: 3.456789 | lr: 6.00e-04 | norm: 0.8234 | "
                    "dt: 156.78ms | tok/sec: 3345.67 | BF16")  # 50 steps left x 0.157 s
    assert progress(7, 50_000, 0.25) == "step    7/50000 0% eta 3h28m" and format_duration(245) == "4m05s"
    assert progress(3, 4, 10.0) == "step    3/4 75% eta 10s"  # the steps left, this one done
    line = format_step_line(1, 0, 3.5, 6e-4, 0.5, 1.0, 2.0, "FP32", lm_loss=3.25, penalty=0.25)
    assert "| loss: 3.500000 | lm_loss: 3.250000 | penalty: 0.250000 | lr:" in line


def test_eval_line_shape_with_mfu_and_callback_metrics():
    assert format_eval_line(40, 5.114067, 166.3456) == "eval step   40 | val_loss: 5.114067 | val_ppl: 166.35"
    line = format_eval_line(40, 2.5, 12.18, 0.4123, "H100", {"hellaswag": 0.31, "sample": "text", "n": 3})
    assert line == ("eval step   40 | val_loss: 2.500000 | val_ppl: 12.18 | mfu: 41.2% of H100 BF16 dense peak | "
                    "hellaswag: 0.3100")  # only float metrics: a string or a count has no column


def test_the_tracker_config_is_flat_with_every_level_in_its_keys():
    """TensorBoard hparams and W&B config take scalars: nested keys join with '/', lists become JSON."""
    flat = flat_tracker_config({"lr": 1e-3, "precision_report": {"layers": {"qkv": {"fp8": 2}}, "keep": ["a", "b"]}})
    assert flat == {"lr": 1e-3, "precision_report/layers/qkv/fp8": 2, "precision_report/keep": '["a", "b"]'}


def test_tracker_settings_are_passed_not_written_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    before = dict(os.environ)
    args = TrackingArgs(use_wandb=True, use_tensorboard=False, wandb_entity="team")
    said = []
    kw = tracker_init_kwargs(args, tmp_path / "run", "my-run", "abc123", say=lambda *a, **k: said.append(a[0]))
    assert kw == {"wandb": {"name": "my-run", "dir": str(tmp_path / "run"), "id": "abc123", "resume": "allow",
                            "entity": "team", "mode": "offline"}}
    assert said and "logging offline" in said[0]
    assert dict(os.environ) == before and tracker_names(args) == ["wandb"]
    kw = tracker_init_kwargs(args, tmp_path, "r", "x", environ={"WANDB_API_KEY": "k"}, say=said.append)
    assert "mode" not in kw["wandb"]  # a key: online
    assert tracker_init_kwargs(TrackingArgs(), tmp_path, "r", None) == {}


def test_wandb_run_id_precedence(tmp_path):
    (tmp_path / "wandb_run_id").write_text("kept01\n")
    assert wandb_run_id(tmp_path, "fromckpt", environ={"WANDB_RUN_ID": "sweep7"}) == "sweep7"  # a sweep's run
    assert wandb_run_id(tmp_path, "fromckpt", environ={}) == "fromckpt"
    assert wandb_run_id(tmp_path, None, environ={}) == "kept01"
    fresh = wandb_run_id(tmp_path / "new", None, environ={})
    assert len(fresh) == 8 and fresh != wandb_run_id(tmp_path / "new", None, environ={})
