"""`yxanul bench` on CPU: real training steps of the real model, rows, table and JSON."""

import json

import pytest
import torch

from yxanul.errors import ConfigError
from yxanul.tools.bench import BenchCommand, cases, main, run
from yxanul.tools.bench_report import markdown

SMALL = dict(presets="nano", seq_lengths="32", tokens_per_micro=64, steps=2, warmup=1, vocab_size=512)


def test_rows_for_every_case_with_fp8_skipped_with_a_reason():
    rows, env = run(BenchCommand(precisions="fp32,bf16,fp8-delayed,fp8-mxfp8", **SMALL), say=lambda *a: None)
    assert [(r["precision"], r["status"]) for r in rows] == [
        ("fp32", "ok"), ("bf16", "ok"), ("fp8-delayed", "skipped"), ("fp8-mxfp8", "skipped")]
    ok = rows[0]
    assert ok["micro_batch"] == 2 and ok["tokens_per_sec"] > 0 and ok["step_ms"] > 0
    assert ok["step_ms_min"] <= ok["step_ms"] <= ok["step_ms_max"]
    assert ok["finite"] and ok["loss_first"] > 5.0  # ≈ ln(512) at init: a real forward on real weights
    assert ok["params"] > 0 and ok["mfu_bf16_peak"] is None  # no known peak on a CPU
    assert rows[2]["reason"] == "no CUDA device"
    assert {r["backend"] for r in rows} == {"torch"}  # 'auto' (the default) resolved before the plan, as in training
    table = markdown(rows, env)
    assert "| nano | 32 | 2 | bf16 |" in table and "1.00x" in table and "skipped: no CUDA device" in table


def test_same_micro_batch_for_every_precision_and_order():
    a = BenchCommand(presets="nano,gpt2-124m", seq_lengths="1024,2048", precisions="bf16,fp8-current")
    got = list(cases(a))
    assert got[:2] == [("nano", 1024, 16, "bf16"), ("nano", 1024, 16, "fp8-current")]
    assert ("gpt2-124m", 2048, 8, "fp8-current") in got and len(got) == 8
    assert {m for _, _, m, _ in cases(BenchCommand(micro_batch_size=3))} == {3}


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "b"
    argv = ["--presets", "nano", "--seq_lengths", "32", "--tokens_per_micro", "64", "--steps", "2",
            "--warmup", "0", "--vocab_size", "512", "--precisions", "fp32", "--out", str(out), "--profile"]
    assert main(argv) == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["rows"][0]["status"] == "ok" and data["env"]["torch"]
    assert (out / "bench.md").read_text().startswith("Device:")
    prof = data["rows"][0]["profile"]  # per-step totals and the top ops of 3 profiled steps, in the row
    text = (out / prof["file"]).read_text()
    assert text.startswith("nano seq 32 micro 2 fp32") and "per step: wall" in text
    assert prof["steps"] == 3 and prof["wall_ms_per_step"] > 0 and prof["host_ms_per_step"] > 0
    assert prof["device_ms_per_step"] is None and prof["top_kernels"] == []  # no CUDA kernels on a CPU
    ops = prof["top_host_ops"]
    assert ops and any(o["name"] in ("aten::mm", "aten::addmm", "aten::bmm") for o in ops)  # the matmuls show
    assert [o["ms_per_step"] for o in ops] == sorted((o["ms_per_step"] for o in ops), reverse=True)
    sites = {(r["op"], r["site"].split("(")[0], r["module"]) for r in prof["sites"]}  # who launched each op's time
    # the MLP's forward GEMMs: the Python line, or (CPython 3.12.0-3.12.4: no Python frames) the module's forward
    where = "yxanul/models/modeling_torch.py" if prof["python_stacks"] else "forward of LayerNormMLP"
    assert ("aten::mm", where, "LayerNormMLP") in sites
    assert ("aten::mm", "backward of MmBackward0", None) in sites  # torch's own backward: the autograd node
    assert "call sites by the op's own host time" in text and f"aten::mm @ {where}" in text
    assert "tok/s" in capsys.readouterr().out


def test_without_python_stacks_the_sites_name_the_module_from_forward_hooks():
    """Where the profiler's Python tracer records no frame (CPython 3.12.0-3.12.4, the GPU image's), each module's
    forward is a profiler range: a forward op's site is its innermost module, a backward op's its autograd node."""
    from torch.profiler import ProfilerActivity, profile

    from yxanul.models import YxanulForCausalLM, config_from_preset
    from yxanul.tools.bench_profile import module_ranges, sites

    model = YxanulForCausalLM(config_from_preset("nano", 512, 32, backend="torch")).train()
    ids = torch.randint(0, 512, (2, 32))
    with profile(activities=[ProfilerActivity.CPU]) as prof, module_ranges():
        model(input_ids=ids, labels=ids).loss.backward()
    got = {(r["op"], r["site"], r["module"]) for r in sites(prof.events(), False, n=200)}
    assert ("aten::mm", "forward of LayerNormMLP", "LayerNormMLP") in got
    assert ("aten::mm", "backward of MmBackward0", None) in got
    assert not [r for r in got if r[1].startswith("nn.Module: ")]  # the ranges themselves are no site
    with profile(activities=[ProfilerActivity.CPU]) as after:  # the hooks are gone with the block
        model(input_ids=ids)
    assert not [e for e in after.events() if e.name.startswith("nn.Module: ")]


def test_rows_are_handed_over_as_they_come():
    """bench.json is rewritten after every case: a run cut off by a timeout keeps what it finished."""
    seen = []
    rows, _ = run(BenchCommand(precisions="fp32,fp8-delayed", **SMALL), say=lambda *a: None,
                  on_row=lambda rows, env: seen.append([r["precision"] for r in rows]))
    assert seen == [["fp32"], ["fp32", "fp8-delayed"]]


def test_time_limit_skips_the_rest():
    rows, _ = run(BenchCommand(precisions="fp32,fp32", time_limit=1e-9, **SMALL), say=lambda *a: None)
    assert rows[0]["status"] == "ok" and rows[1]["status"] == "skipped" and "time limit" in rows[1]["reason"]


@pytest.mark.parametrize("kw,key", [({"precisions": "fp16"}, "precisions"), ({"presets": "huge"}, "presets"),
                                    ({"seq_lengths": "8"}, "seq_lengths"), ({"steps": 0}, "steps"),
                                    ({"backend": "jax"}, "backend"), ({"presets": ""}, "presets"),
                                    ({"presets": " , "}, "presets"), ({"precisions": ""}, "precisions"),
                                    ({"seq_lengths": ""}, "seq_lengths")])
def test_bad_arguments_are_one_line_errors(kw, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        BenchCommand(**kw)


@pytest.mark.parametrize("kw,needle", [
    ({"tokens_per_micro": 1000, "seq_lengths": "512,1024"}, "'tokens_per_micro': expected an integer >= the "
                                                            "longest seq_lengths (1024)"),
    ({"fp8_min_gemm_dim": -2}, "'fp8_min_gemm_dim': expected an integer >= 0, or -1"),
    ({"time_limit": -5.0}, "'time_limit': expected seconds >= 0"),
    ({"time_limit": float("nan")}, "'time_limit': expected seconds >= 0")])
def test_values_that_ran_but_not_as_asked_are_refused(kw, needle):
    """tokens_per_micro below a sequence length ran every such case at micro-batch 1, -2 read as -1 (the training
    default), and a negative time limit skipped every case after the first (NaN: no limit)."""
    with pytest.raises(ConfigError) as e:
        BenchCommand(**kw)
    assert needle in str(e.value)


def test_a_range_mistake_is_one_line_and_micro_batch_size_makes_tokens_per_micro_unused(capsys):
    from yxanul.cli import main as cli

    tiny = ["--presets", "nano", "--seq_lengths", "32", "--tokens_per_micro", "32", "--precisions", "fp32", "--steps",
            "1", "--warmup", "0", "--vocab_size", "512"]  # one small case, were it not refused
    assert cli(["bench", *tiny, "--time_limit", "-5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "error: config key 'time_limit': expected seconds >= 0 (0: no " \
        "limit), got -5.0\n", captured
    BenchCommand(tokens_per_micro=100, seq_lengths="1024", micro_batch_size=1, fp8_min_gemm_dim=-1)


@pytest.mark.parametrize("flag", ["--presets", "--precisions", "--seq_lengths"])
def test_an_empty_list_is_a_usage_error_not_an_empty_table(capsys, flag):
    """No case to run would print an empty table and exit 0, as if the benchmark passed."""
    from yxanul.cli import main as cli

    assert cli(["bench", flag, ""]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"error: config key '{flag[2:]}': expected "), captured
    assert captured.err.count("\n") == 1


def test_speed_variants_master_weights_and_cuda_graphs():
    """Issue 22's flags are bench variants: master weights train on CPU (BF16 params, fp32 masters; fp32 is
    skipped), CUDA graphs and the fused QKV flags are skipped rows with a one-line reason where the TE
    backend (on CUDA) is missing."""
    import torch

    a = BenchCommand(precisions="fp32,bf16", master_weights="fp32", **SMALL)
    rows, env = run(a, say=lambda *x: None)
    assert [(r["precision"], r["status"]) for r in rows] == [("fp32", "skipped"), ("bf16", "ok")]
    assert rows[1]["variant"] == "master=fp32" and rows[1]["finite"] and rows[1]["loss_first"] > 5.0
    assert "bf16 (master=fp32)" in markdown(rows, env)
    if not torch.cuda.is_available():
        rows, _ = run(BenchCommand(precisions="bf16", cuda_graphs=True, **SMALL), say=lambda *x: None)
        assert rows[0]["status"] == "skipped" and rows[0]["variant"] == "graphs"
        assert rows[0]["reason"].startswith("config key 'cuda_graphs'")
    # the torch twin ignores the TE-only QKV flags: no row times the plain model under their label
    rows, _ = run(BenchCommand(precisions="bf16", backend="torch", fuse_qkv_rope=True, **SMALL), say=lambda *x: None)
    assert rows[0]["status"] == "skipped" and rows[0]["variant"] == "qkv_rope", rows[0]
    assert rows[0]["reason"] == "fuse_qkv_rope: Transformer Engine backend only"
    rows, _ = run(BenchCommand(precisions="bf16", backend="torch", norm_kernel="cudnn", **SMALL), say=lambda *x: None)
    assert (rows[0]["status"], rows[0]["variant"]) == ("skipped", "norm=cudnn")
    assert rows[0]["reason"] == "norm_kernel: Transformer Engine backend only"


def test_cpu_vs_nanogpt_script_writes_both_rows(tmp_path, capsys):
    """scripts/cpu_vs_nanogpt.py (issue 22.6) in-process for 2 steps each: yxanul's train_step and nanoGPT's
    loop both train (loss ≈ ln V at init), the JSON has both rows and the ratio; no timing is asserted."""
    import importlib.util
    import math
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "cpu_vs_nanogpt.py"
    spec = importlib.util.spec_from_file_location("cpu_vs_nanogpt", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "cpu.json"
    argv = ["--threads", "1", "--seq_length", "32", "--micro_batch_size", "2", "--vocab_size", "512",
            "--rounds", "1", "--steps", "1", "--warmup", "1", "--out", str(out)]
    import torch

    threads = torch.get_num_threads()
    try:
        assert script.main(argv) == 0
    finally:
        torch.set_num_threads(threads)  # the script sets it process-wide: the rest of the suite keeps its own
    data = json.loads(out.read_text())
    yx, nano = data["rows"]
    assert yx["name"].startswith("yxanul nano") and nano["name"] == "nanoGPT GPT"
    for r in (yx, nano):
        assert r["tok_per_s"] > 0 and r["params"] > 0 and r["flops_per_token"] > 0
        assert abs(r["loss_first"] - math.log(512)) < 0.5  # a real forward of a freshly initialised model
    assert yx["flops_per_token"] == 6 * yx["matmul_params"] + 12 * 4 * 256 * 32  # YxanulConfig.flops_per_token
    assert data["env"]["torch_threads"] == 1 and "tok/s A/B" in data["ratio"]
    assert "| nanoGPT GPT |" in capsys.readouterr().out


def test_gradient_accumulation_steps_are_micro_batches_of_one_timed_step():
    """A step of N micro-batches, as the trainer accumulates (per-step costs amortize): the row counts N x micro
    x seq tokens per step, and the step's loss is over both batches (the same weights give another loss)."""
    import torch

    def first(accum):
        torch.manual_seed(0)  # the same initial weights in each run
        a = BenchCommand(precisions="fp32", gradient_accumulation_steps=accum, **dict(SMALL, warmup=0, steps=1))
        return run(a, say=lambda *x: None)

    one, again, (two, env) = first(1)[0][0], first(1)[0][0], first(2)
    assert one["loss_first"] == again["loss_first"] and two[0]["loss_first"] != one["loss_first"]
    r = two[0]
    assert r["accumulation"] == 2 and r["micro_batch"] == 2
    # step_ms is rounded to 0.01 ms: on a fast CPU (a 4 ms step) that alone moves the product by 1e-3
    assert r["tokens_per_sec"] * r["step_ms"] / 1e3 == pytest.approx(2 * 2 * 32, rel=1e-3 + 0.006 / r["step_ms"])
    assert "| nano | 32 | 2 x 2 | fp32 |" in markdown(two, env)
    with pytest.raises(ConfigError, match="'gradient_accumulation_steps'"):
        BenchCommand(gradient_accumulation_steps=0)


def test_each_case_gets_the_speed_defaults_a_run_would_get():
    """The table's flags for (backend, preset) where the command line did not set them, per case as the trainer
    holds them off (fp32 compute: no BF16 weights); the row says what ran and what the table added."""
    from yxanul.training.speed_defaults import check_table

    table = check_table({"torch": {"nano": {"flags": "--loss_impl chunked --master_weights fp32", "evidence": "x"}}},
                        backends=("te", "torch"))
    quiet = dict(say=lambda *x: None, speed_table=table)
    fp32, bf16 = run(BenchCommand(precisions="fp32,bf16", **SMALL), **quiet)[0]
    assert fp32["status"] == bf16["status"] == "ok"
    assert fp32["flags"] == fp32["speed_defaults"] == "--loss_impl chunked" and fp32["variant"] == "loss=chunked"
    assert bf16["flags"] == bf16["speed_defaults"] == "--loss_impl chunked --master_weights fp32"
    given = run(BenchCommand(precisions="fp32", loss_impl="default", **SMALL), given={"loss_impl"}, **quiet)[0][0]
    assert (given["flags"], given["speed_defaults"], given["variant"]) == ("", "", "")  # the command line wins
    plain = run(BenchCommand(precisions="fp32", speed_defaults=False, **SMALL), **quiet)[0][0]
    assert (plain["flags"], plain["speed_defaults"], plain["variant"]) == ("", "", "")
    assert run(BenchCommand(precisions="fp32", **SMALL), say=lambda *x: None)[0][0]["speed_defaults"] == ""  # shipped
    table["torch"]["nano"]["fp8_min_gemm_dim"] = 0  # FP8 measured to pay on every layer with these flags
    fp8 = run(BenchCommand(precisions="bf16,fp8-delayed", **SMALL), **quiet)[0]
    assert fp8[0]["speed_defaults"] == "--loss_impl chunked --master_weights fp32"  # BF16: no FP8 threshold
    assert fp8[1]["speed_defaults"] == "--loss_impl chunked --master_weights fp32 --fp8_min_gemm_dim 0"
    assert fp8[1]["flags"] == "--loss_impl chunked --master_weights fp32"  # a variant's flags: the speed keys only
    own = run(BenchCommand(precisions="fp8-delayed", fp8_min_gemm_dim=64, **SMALL), given={"fp8_min_gemm_dim"},
              **quiet)
    assert own[0][0]["speed_defaults"] == "--loss_impl chunked --master_weights fp32"  # the command line wins


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_backend_te_where_it_cannot_run_is_one_line_not_every_case_skipped(tmp_path, capsys):
    from yxanul.cli import main as cli

    assert cli(["bench", "--backend", "te", "--presets", "nano", "--seq_lengths", "32", "--precisions", "fp32",
                "--steps", "1", "--warmup", "0", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: config key 'backend': expected 'auto' or 'torch' here (--backend te needs Transformer "
                       "Engine and a CUDA device), got 'te'"), err
    assert not (tmp_path / "b").exists()


def test_an_out_folder_that_cannot_be_made_fails_before_the_first_case(tmp_path, capsys):
    """bench.json is first written after a case: a --out that cannot be created or written is one line, exit 2,
    before anything is measured (a file in the way: the flag's check; /proc: creating it, as root too)."""
    from yxanul.cli import main as cli

    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["bench", "--presets", "nano", "--seq_lengths", "32", "--tokens_per_micro", "32", "--precisions", "fp32",
            "--steps", "1", "--warmup", "0", "--vocab_size", "512"]
    for out, why in ((blocker / "b", f"a folder that can be created ('{blocker}' is a file)"),
                     (blocker, "a folder (it is an existing file)"),
                     ("/proc/yxanul-bench/b", "a folder that can be ")):
        assert cli([*argv, "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert "bench on" not in captured.out and "tok/s" not in captured.out, captured.out  # nothing measured
        assert captured.err.startswith(f"error: config key 'out': expected {why}"), captured.err
        assert captured.err.count("\n") == 1
