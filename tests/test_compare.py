"""`yxanul compare` on two real CPU runs: FP32 against BF16 autocast on the same data."""

import json

import pytest

from yxanul.tools.compare import compare, main, read_run, smooth
from yxanul.errors import UserError

from test_trainer import FAST, yxanul


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    common = [*FAST, "--max_steps", "30", "--eval_freq", "15", "--checkpoint_freq", "0", "--log_freq", "1"]
    yxanul("train", *common, "--mixed_precision", "fp32", "--output_dir", str(root / "fp32"))
    yxanul("train", *common, "--mixed_precision", "bf16", "--output_dir", str(root / "bf16"))
    return root / "fp32", root / "bf16"


def test_bf16_tracks_fp32_and_the_plot_is_written(two_runs, tmp_path, capsys):
    a, b = two_runs
    png = tmp_path / "cmp.png"
    assert main([str(a), str(b), "--out", str(png), "--tolerance", "0.05", "--json"]) == 0
    out = capsys.readouterr().out
    res = json.JSONDecoder().raw_decode(out)[0][0]
    assert res["common_steps"] == 30 and res["window_steps"] == [25, 30]
    assert abs(res["train_rel_diff"]) < 0.05 and res["val_step"] == 30
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
    assert res["val_rel_diff"] == 0.0
    assert smooth([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(UserError, match="no metrics.jsonl"):
        read_run(tmp_path)
    with pytest.raises(UserError, match="at least two"):
        main([str(tmp_path)])
