"""`yxanul compare` on two real CPU runs: FP32 against BF16 autocast on the same data."""

import json

import pytest
from tiny_run import FAST, yx

from yxanul.errors import UserError
from yxanul.tools.compare import Curves, compare, main, read_run, smooth


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    # 8 steps: BF16 autocast's CPU matmuls are ~40x slower than FP32's on CPUs without native BF16 (AVX2 only)
    common = [*FAST, "--warmup_steps", "1", "--max_steps", "8", "--eval_freq", "4", "--checkpoint_freq", "0",
              "--log_freq", "1"]
    yx("train", *common, "--mixed_precision", "fp32", "--output_dir", str(root / "fp32"))
    yx("train", *common, "--mixed_precision", "bf16", "--output_dir", str(root / "bf16"))
    return root / "fp32", root / "bf16"


def test_bf16_tracks_fp32_and_the_plot_is_written(two_runs, tmp_path, capsys):
    a, b = two_runs
    png = tmp_path / "cmp.png"
    assert main([str(a), str(b), "--out", str(png), "--tolerance", "0.05", "--json"]) == 0
    out = capsys.readouterr().out
    res = json.JSONDecoder().raw_decode(out)[0][0]
    assert res["common_steps"] == 8 and res["window_steps"] == [7, 8]
    assert abs(res["train_rel_diff"]) < 0.05 and res["val_step"] == 8
    assert "(FP32)" in res["baseline"] and "(BF16)" in res["run"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_tolerance_failure_exits_1(two_runs, tmp_path, capsys):
    a, b = two_runs
    assert main([str(a), str(b), "--out", str(tmp_path / "c.png"), "--tolerance", "0"]) == 1
    assert "OUTSIDE 0%" in capsys.readouterr().out


def test_resumed_rows_last_wins_and_relative_difference(tmp_path):
    for name, losses in (("a", [4.0, 3.0, 2.0]), ("b", [4.0, 3.5, 2.2])):
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": s, "loss": v, "precision": "BF16"} for s, v in enumerate(losses, 1)]
        rows.insert(1, {"step": 2, "loss": 99.0, "precision": "BF16"})  # overwritten by the resumed row
        rows.append({"step": 3, "val_loss": 2.5})
        d.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    a, b = read_run(tmp_path / "a"), read_run(tmp_path / "b")
    assert a.train[2] == 3.0 and a.val == {3: 2.5}
    res = compare(a, b, window=1.0)
    assert res["train_rel_diff"] == pytest.approx((9.7 / 3 - 3.0) / 3.0)
    assert res["val_rel_diff"] == 0.0 and res["notes"] == []  # same ends, 3 steps in the mean
    assert smooth([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]
    longer = tmp_path / "c"  # 8 steps logged at 1 and 8: shares only step 1 with a 4-step run logged at 1 and 4
    longer.mkdir()
    longer.joinpath("metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "loss": 5.0 - s / 4}) for s in (1, 8)))
    short = tmp_path / "d"
    short.mkdir()
    short.joinpath("metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "loss": 5.0 - s / 4}) for s in (1, 4)))
    notes = compare(read_run(short), read_run(longer))["notes"]
    assert notes == ["the runs end at different steps (4 and 8): compared on the 1 logged step(s) they share, up to "
                     "step 1", "the training-loss mean covers 1 logged step(s): a weak comparison (log more often, "
                     "--log_freq, or widen --window)"]


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(UserError, match="no metrics.jsonl"):
        read_run(tmp_path)
    with pytest.raises(UserError, match="at least two"):
        main([str(tmp_path)])


def test_few_points_are_drawn_raw_and_the_sweep_plots_the_lm_loss(tmp_path, capsys):
    """5 logged points: no 10-point mean dragging the start forward (the train line sat above val), the raw
    values are drawn; `lm_loss` rows (a penalty run) give the LM loss, so equal LM losses are 0 % apart."""
    from yxanul.tools.compare import plot, smoothing_window

    for name, pen in (("a", 0.0), ("b", 0.05)):
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": s, "loss": v + pen, "lm_loss": v, "penalty": pen, "precision": "FP32"}
                for s, v in zip(range(1, 6), [9.0, 7.0, 6.0, 5.5, 5.2])] + [{"step": 5, "val_loss": 5.4}]
        d.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    runs = [read_run(tmp_path / n, loss_key="lm_loss") for n in "ab"]
    assert smoothing_window(runs, 10) == 1 and smoothing_window([runs[0]] * 2, 10) == 1
    drawn = plot(runs, tmp_path / "c.png")
    assert [v for _, v, _ in drawn[runs[0].label]] == [9.0, 7.0, 6.0, 5.5, 5.2]  # as logged, below val at step 5
    assert [r for _, _, r in drawn[runs[1].label]] == [0.0] * 5
    totals = [read_run(tmp_path / n) for n in "ab"]  # the total loss (with the penalty) differs
    assert plot(totals, tmp_path / "t.png")[totals[1].label][0][2] == pytest.approx(100 * 0.05 / 9.0)
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m.png")]) == 0
    line = capsys.readouterr().out.splitlines()[0]  # `yxanul compare` of a sweep's trials: the LM losses, 0 % apart
    assert "train LM loss (without the penalty term) 5.2000 vs 5.2000 (+0.00%" in line, line
    long = Curves("l", "l", {s: 1.0 for s in range(1, 201)}, {})
    assert smoothing_window([long], 10) == 10
