"""The defaults-decision rule on real CPU bench JSONs (tests/fixtures/bench, see test_bench_table.py): a
variant's tokens/s is scaled here to land on either side of the 3 % bar; the rule, not the numbers, is tested."""

import copy
import json
from pathlib import Path

import pytest

from yxanul.errors import UserError
from yxanul.tools.bench_decide import decide, fp8_threshold, main, parity_from_runs

FIXTURES = Path(__file__).parents[1] / "fixtures" / "bench"
PARITY_OK = {"model": "medium", "flags": "", "val_step": 250, "val_loss_bf16": 4.40, "val_loss_fp8": 4.41,
             "val_rel_diff": 0.01 / 4.40}


def _load(v):
    return json.loads((FIXTURES / v / "bench.json").read_text())


def _scaled(data, factor, precision="bf16"):
    """The default's own JSON with one precision's tokens/s scaled and its step times divided (a variant exactly
    ``factor`` faster)."""
    out = copy.deepcopy(data)
    for r in out["rows"]:
        if r["precision"] == precision and r["status"] == "ok":
            r["tokens_per_sec"] *= factor
            r.update({k: r[k] / factor for k in ("step_ms", "step_ms_min", "step_ms_max")})
    return out


def test_faster_by_the_bar_becomes_default_only_with_parity_of_its_own_flags():
    base = _load("default")
    parity = dict(PARITY_OK, flags="--cuda_graphs --master_weights fp32")  # trained with master-fp32's flags
    got = decide({"default": base, "master-fp32": _scaled(base, 1.031), "loss-chunked": _scaled(base, 1.029)},
                 parity)
    by = {d["variant"]: d for d in got}
    assert by["master-fp32"]["verdict"] == "default" and by["master-fp32"]["speedup"] == {"bf16": 1.031}
    assert by["master-fp32"]["reason"] == "bf16 1.03x; parity +0.23 % with its flags"
    assert by["loss-chunked"]["verdict"] == "flag" and by["loss-chunked"]["reason"] == "bf16 1.029x < 1.03x"
    assert decide({"default": base, "master-fp32": _scaled(base, 1.2)}, None)[0]["verdict"] == "pending"
    bad = dict(parity, val_rel_diff=0.006)
    d = decide({"default": base, "master-fp32": _scaled(base, 1.2)}, bad)[0]
    assert d["verdict"] == "flag" and "+0.60 % > 0.5 %" in d["reason"]
    d = decide({"default": base, "master-fp32": _scaled(base, 1.2)}, PARITY_OK)[0]  # parity without its flags
    assert d["verdict"] == "pending" and "PARITY_FLAGS='--master_weights fp32' gpu_checks.sh parity" in d["reason"]


def test_a_median_gain_inside_the_steps_spread_stays_a_flag():
    """Faster at the median but not on the fastest step (a host-bound eager step jitters): not a gain."""
    base = _load("default")
    jitter = _scaled(base, 1.2)
    for r in jitter["rows"]:
        if r["precision"] == "bf16" and r["status"] == "ok":
            r["step_ms_min"] = base["rows"][0]["step_ms_min"] * 1.1  # its best step 10 % slower than the default's
    d = decide({"default": base, "graphs": jitter}, dict(PARITY_OK, flags="--cuda_graphs"))[0]
    assert d["verdict"] == "flag" and "bf16 1.200x, but 0.909x < 1.03x on the fastest step" in d["reason"]
    assert decide({"default": base, "graphs": _scaled(base, 1.2)}, dict(PARITY_OK, flags="--cuda_graphs"))[0][
        "verdict"] == "default"


def test_a_variant_that_did_not_run_where_the_default_did_stays_a_flag():
    base = _load("default")
    broken = copy.deepcopy(base)
    broken["rows"][0].update(status="OOM", reason="out of memory at micro-batch 2")
    d = decide({"default": base, "graphs": broken}, PARITY_OK)[0]
    assert d["verdict"] == "flag" and d["reason"] == "bf16 not measured (OOM)"
    nonfinite = _scaled(base, 2.0)
    nonfinite["rows"][0]["finite"] = False  # fast but diverged: never a default
    assert decide({"default": base, "stack": nonfinite}, PARITY_OK)[0]["verdict"] == "flag"
    with pytest.raises(UserError, match="no 'default' variant"):
        decide({"graphs": base}, PARITY_OK)


def test_a_gain_is_compared_unrounded_and_a_precision_only_the_variant_ran_or_a_nan_parity_is_no_default():
    base = _load("default")
    parity = dict(PARITY_OK, flags="--master_weights fp32")
    d = decide({"default": base, "master-fp32": _scaled(base, 1.0296)}, parity)[0]  # rounds to 1.03: no 3 %
    assert d["verdict"] == "flag" and d["reason"] == "bf16 1.030x < 1.03x"
    fp8 = _with_fp8(base, 1.2)  # the default's FP8 case skipped (a time limit), the variant's measured and slower
    skipped = copy.deepcopy(fp8)
    for r in skipped["rows"]:
        if r["precision"] == "fp8-delayed":
            r.update(status="skipped", reason="time limit")
    slower = _scaled(_scaled(fp8, 1.2), 0.8, "fp8-delayed")
    d = decide({"default": skipped, "master-fp32": slower}, parity)[0]
    assert d["verdict"] == "flag" and "fp8-delayed: today's default not measured (skipped)" in d["reason"]
    d = decide({"default": base, "master-fp32": _scaled(base, 1.2)}, dict(parity, val_rel_diff=float("nan")))[0]
    assert d["verdict"] == "flag" and "+nan % > 0.5 %" in d["reason"]
    # One-sided: FP8 above BF16 by more than the tolerance fails the parity, FP8 below it by as much passes
    d = decide({"default": base, "master-fp32": _scaled(base, 1.2)}, dict(parity, val_rel_diff=0.006))[0]
    assert d["verdict"] == "flag" and "+0.60 % > 0.5 %" in d["reason"]
    d = decide({"default": base, "master-fp32": _scaled(base, 1.2)}, dict(parity, val_rel_diff=-0.012))[0]
    assert d["verdict"] == "default" and d["reason"].endswith("parity -1.20 % with its flags")


def test_a_parity_file_that_is_missing_or_of_something_else_is_one_line(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "2026-11-27-cpu-default.json").write_text(json.dumps(_load("default")))
    (tmp_path / "profile.json").write_text(json.dumps(_load("default")))
    (tmp_path / "nano.json").write_text(json.dumps(dict(PARITY_OK, model="nano")))
    for parity, needle in [("typo.jsn", "no such file"), ("profile.json", r"not a parity result \(no model, val_step"),
                           ("nano.json", "a parity of nano, the rule asks medium")]:
        with pytest.raises(UserError, match=needle):
            main(["--bench_dir", str(bench), "--parity", str(tmp_path / parity)])


def test_fp8_threshold_from_the_default_rows():
    """FP8 / BF16 per preset (hidden size from the preset): the threshold is the width from which FP8 wins at
    every larger measured preset; one loss above it keeps the width higher."""
    base = _load("default")
    bf16, fp8 = base["rows"][0], base["rows"][1]
    rows = []
    for preset, ratio in (("gpt2-124m", 0.8), ("medium", 1.05), ("xlarge", 1.3)):
        rows += [dict(bf16, preset=preset, seq_length=1024),
                 dict(fp8, preset=preset, seq_length=1024, status="ok", finite=True,
                      tokens_per_sec=bf16["tokens_per_sec"] * ratio)]
    assert fp8_threshold({"rows": rows}) == (1024, [("gpt2-124m", 1024, 768, 0.8), ("medium", 1024, 1024, 1.05),
                                                     ("xlarge", 1024, 1920, 1.3)])
    rows[3]["tokens_per_sec"] = bf16["tokens_per_sec"] * 1.02  # medium no longer pays
    assert fp8_threshold({"rows": rows})[0] == 1920
    assert fp8_threshold(base) == (None, [])  # a CPU: no FP8 row ran


def test_parity_from_two_runs_and_the_cli(tmp_path, capsys):
    for name, val in (("bf16", 4.40), ("fp8", 4.43)):
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": s, "loss": 5.0 - s / 100, "precision": name.upper()} for s in range(1, 11)]
        rows.append({"step": 10, "val_loss": val})
        d.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    p = parity_from_runs(str(tmp_path / "bf16"), str(tmp_path / "fp8"))
    assert p["val_step"] == 10 and p["val_rel_diff"] == pytest.approx(0.03 / 4.40)
    out = tmp_path / "parity.json"
    assert main(["--parity_runs", f"{tmp_path / 'bf16'},{tmp_path / 'fp8'}", "--parity_out", str(out)]) == 1
    assert json.loads(out.read_text())["val_loss_fp8"] == 4.43 and "OUTSIDE 0.5 %" in capsys.readouterr().out
    bench = tmp_path / "bench"
    bench.mkdir()
    for v, data in (("default", _load("default")), ("loss-te", _scaled(_load("default"), 1.1))):
        (bench / f"2026-11-27-cpu-{v}.json").write_text(json.dumps(data))
    (bench / "2026-11-27-cpu-parity.json").write_text(json.dumps(dict(PARITY_OK, flags="--loss_impl te")))
    assert main(["--bench_dir", str(bench)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("defaults decision from 2026-11-27-cpu")
    assert "DEFAULT  loss-te       nano       seq 32: bf16 1.10x; parity +0.23 % with its flags" in text
    assert "fp8_min_gemm_dim: no change" in text
    with pytest.raises(UserError, match="BF16_RUN,FP8_RUN"):
        main(["--parity_runs", "one"])
    with pytest.raises(UserError, match="no YYYY-MM-DD"):
        main(["--bench_dir", str(tmp_path / "fp8")])


def _with_flags(data, flags):
    out = copy.deepcopy(data)
    for r in out["rows"]:
        r["flags"] = flags
    return out


def test_the_default_verdicts_are_written_into_the_speed_defaults_table(tmp_path, capsys):
    """--write: per preset the fastest variant that is 'default', with the flags its rows ran with and the evidence;
    what the trainer reads back. A flag verdict changes nothing; a winning 'plain' removes the entry; a variant whose
    flags the table cannot hold (--torch_compile) never enters it."""
    from yxanul.tools.bench_decide import table_entries, write_table
    from yxanul.training.speed_defaults import load_table

    base = _load("default")
    parity = dict(PARITY_OK, flags="--loss_impl te --fuse_qkv_params --cuda_graphs")
    variants = {"default": base, "loss-te": _with_flags(_scaled(base, 1.05), "--loss_impl te"),
                "stack-no-masters": _with_flags(_scaled(base, 1.2), parity["flags"]),
                "compile": _scaled(base, 1.5), "graphs": _with_flags(_scaled(base, 1.01), "--cuda_graphs")}
    decisions = decide(variants, parity)
    assert {d["variant"]: d["verdict"] for d in decisions} == {
        "loss-te": "default", "stack-no-masters": "default", "graphs": "flag", "compile": "pending"}
    entries = table_entries(decisions, "2026-11-27-cpu", parity)
    assert entries == {"nano": {"flags": "--loss_impl te --fuse_qkv_params --cuda_graphs",
                                "evidence": "2026-11-27-cpu stack-no-masters: bf16 1.20x; parity +0.23 % with its "
                                            "flags"}}
    table = tmp_path / "speed_defaults.yaml"
    table.write_text("te: {}\n")
    assert write_table(table, entries) == [f"  nano: {entries['nano']['flags']} ({entries['nano']['evidence']})"]
    assert load_table(table)["te"]["nano"]["values"] == {"loss_impl": "te", "fuse_qkv_params": True,
                                                         "cuda_graphs": True}
    assert write_table(table, entries) == []  # the same winner again: unchanged
    plain = decide({"default": _with_flags(base, entries["nano"]["flags"]), "plain": _with_flags(
        _scaled(base, 1.1), "")}, parity)
    assert write_table(table, table_entries(plain, "2026-11-28-cpu", parity)) == [
        "  nano: speed defaults removed (plain won)"]
    assert load_table(table) == {"te": {}}
    bench = tmp_path / "bench"  # the CLI: the committed JSONs of one tag, --write into --table
    bench.mkdir()
    for v, data in variants.items():
        (bench / f"2026-11-27-cpu-{v}.json").write_text(json.dumps(data))
    (bench / "2026-11-27-cpu-parity.json").write_text(json.dumps(parity))
    assert main(["--bench_dir", str(bench), "--write", "--table", str(table)]) == 0
    assert f"{table}: changed:\n  nano: --loss_impl te --fuse_qkv_params --cuda_graphs" in capsys.readouterr().out
    assert load_table(table)["te"]["nano"]["evidence"].startswith("2026-11-27-cpu stack-no-masters")


def test_parity_flags_are_read_from_what_the_runs_trained_with(tmp_path):
    """The FP8 run's config.yaml (given flags and speed defaults alike), not the flags a script passed."""
    for name in ("bf16", "fp8"):
        d = tmp_path / name
        d.mkdir()
        d.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
            {"step": 10, "loss": 4.5}, {"step": 10, "val_loss": 4.4})))
        d.joinpath("config.yaml").write_text("loss_impl: te\nfuse_qkv_params: true\ncuda_graphs: true\n"
                                             "master_weights: none\n")
    p = parity_from_runs(str(tmp_path / "bf16"), str(tmp_path / "fp8"), flags="--cuda_graphs")
    assert p["flags"] == "--loss_impl te --fuse_qkv_params --cuda_graphs"


def _with_fp8(data, ratio):
    """``data`` with its FP8 row run, ``ratio`` x its BF16 row's tokens/s (step times divided alike)."""
    out = copy.deepcopy(data)
    bf16 = next(r for r in out["rows"] if r["precision"] == "bf16")
    out["rows"] = [r for r in out["rows"] if r["precision"] != "fp8-delayed"] + [dict(
        bf16, precision="fp8-delayed", tokens_per_sec=bf16["tokens_per_sec"] * ratio,
        **{k: bf16[k] / ratio for k in ("step_ms", "step_ms_min", "step_ms_max")})]
    return out


@pytest.mark.parametrize("ratio, dim", [(1.1, 0), (1.02, None)])
def test_an_entry_takes_fp8_min_gemm_dim_0_only_where_its_own_fp8_pays(tmp_path, ratio, dim):
    """The winner's own FP8 ÷ BF16 (every layer in FP8, as the bench runs) >= the bar, also on the fastest step:
    its entry says FP8 pays on every layer with its flags (`fp8_min_gemm_dim: 0`); below the bar it says nothing."""
    from yxanul.tools.bench_decide import table_entries, write_table
    from yxanul.training.speed_defaults import load_table

    base = _load("default")
    parity = dict(PARITY_OK, flags="--loss_impl te --fuse_qkv_params --cuda_graphs")
    stack = _with_fp8(_with_flags(_scaled(base, 1.2), parity["flags"]), 1.0)
    stack = _with_fp8(stack, ratio)
    decisions = decide({"default": _with_fp8(base, 0.8), "stack-no-masters": stack}, parity)
    assert decisions[0]["fp8_vs_bf16"] == ratio and decisions[0]["verdict"] == "default"
    entry = table_entries(decisions, "2026-11-27-cpu", parity)["nano"]
    assert entry.get("fp8_min_gemm_dim") == dim and ("FP8 1.10x its BF16" in entry["evidence"]) is (dim == 0)
    table = tmp_path / "speed_defaults.yaml"
    write_table(table, {"nano": entry})
    assert load_table(table)["te"]["nano"]["fp8_min_gemm_dim"] == dim


def test_an_fp8_only_flag_is_asked_its_gain_in_fp8_and_no_loss_in_bf16():
    """``--fp8_attention`` leaves the BF16 step as it is: there it must only not be slower than the noise; its
    3 % is asked of FP8 (rows made FP8 here from the CPU fixture's BF16 one: the rule is tested, not TE)."""
    base = copy.deepcopy(_load("default"))
    bf16 = next(r for r in base["rows"] if r["precision"] == "bf16")
    base["rows"] = [bf16, dict(copy.deepcopy(bf16), precision="fp8-delayed")]
    parity = dict(PARITY_OK, flags="--fp8_attention")

    def variant(bf16_factor, fp8_factor, flags="--fp8_attention"):
        return _with_flags(_scaled(_scaled(base, bf16_factor), fp8_factor, "fp8-delayed"), flags)

    d = decide({"default": base, "fp8-attention": variant(0.99, 1.05)}, parity)[0]
    assert d["verdict"] == "default" and d["speedup"] == {"bf16": 0.99, "fp8-delayed": 1.05}, d
    d = decide({"default": base, "fp8-attention": variant(0.95, 1.05)}, parity)[0]
    assert d["verdict"] == "flag" and d["reason"] == "bf16 0.950x < 0.97x where its flags change nothing"
    d = decide({"default": base, "fp8-attention": variant(1.0, 1.02)}, parity)[0]
    assert d["verdict"] == "flag" and d["reason"] == "fp8-delayed 1.020x < 1.03x"
    # a flag that changes BF16 too is asked its gain there as before
    loss_te = variant(0.99, 1.05, "--loss_impl te")
    d = decide({"default": base, "loss-te": loss_te}, dict(parity, flags="--loss_impl te"))
    assert d[0]["verdict"] == "flag" and d[0]["reason"] == "bf16 0.990x < 1.03x"
