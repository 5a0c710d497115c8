"""The sweep report from trials' metrics.jsonl: ranking by the metric's last value (a resumed trial's
repeated steps: last row wins), goal, the table's columns, best.json and the PNGs (fast: no training)."""

import json
import math

import pytest

from yxanul.sweep.report import summarize

PNG = b"\x89PNG\r\n\x1a\n"


def run(root, name, train, val, tps=1000.0, precision="BF16"):
    d = root / name
    d.mkdir(parents=True)
    rows = [{"step": s, "loss": v, "tokens_per_sec": tps, "precision": precision} for s, v in train]
    rows += [{"step": s, "val_loss": v, "val_ppl": 2.718 ** v} for s, v in val]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(d)


def state(root, trials, metric="eval/val_loss", goal="minimize"):
    (root / "sweep.json").write_text(json.dumps({
        "name": "s", "method": "grid", "metric": metric, "goal": goal, "swept": ["penalty_weight"],
        "trials": [{"id": i, "params": {"penalty_weight": w, "max_steps": 4}, "run_dir": d, "status": "done"}
                   for i, w, d in trials]}))


def test_best_is_the_lowest_final_val_loss_after_a_resume(tmp_path):
    a = run(tmp_path, "a", [(1, 9.0), (2, 8.0)], [(2, 5.0), (4, 6.0)])  # best 5.0 but final 6.0
    # b resumed from step 2: its first step-4 evaluation (7.0) was redone (5.5); the last row wins
    b = run(tmp_path, "b", [(1, 9.0), (2, 8.1)], [(2, 6.5), (4, 7.0), (4, 5.5)], precision="FP8")
    state(tmp_path, [("trial-000", 0.0, a), ("trial-001", 0.01, b)])
    best = summarize(tmp_path, say=lambda *x: None)
    assert best["trial"] == "trial-001" and best["final"] == 5.5 and best["params"]["penalty_weight"] == 0.01
    assert json.loads((tmp_path / "best.json").read_text())["trial"] == "trial-001"
    table = (tmp_path / "summary.md").read_text()
    assert "| trial-000 | 0 | 6 | 5 | 1000 | BF16 | done |" in table
    assert "| trial-001 | 0.01 | 5.5 | 5.5 | 1000 | FP8 | done |" in table
    for png in ("eval_val_loss_vs_penalty_weight.png", "loss_curves.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG


def test_maximize_and_a_trial_without_metrics_yet(tmp_path):
    a = run(tmp_path, "a", [(1, 9.0)], [(1, 3.0)])
    b = run(tmp_path, "b", [(1, 9.0)], [(1, 4.0)])
    state(tmp_path, [("t0", 0.0, a), ("t1", 0.1, b), ("t2", 0.2, str(tmp_path / "not-started"))],
          metric="eval/val_ppl", goal="maximize")
    best = summarize(tmp_path, say=lambda *x: None)
    assert best["trial"] == "t1" and best["final"] == pytest.approx(2.718 ** 4.0)
    assert "final eval/val_ppl" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "eval_val_ppl_vs_penalty_weight.png").is_file()


def test_a_task_metric_is_read_from_the_evaluation_rows_key_without_eval(tmp_path):
    """metrics.jsonl carries `cloze_acc` next to `val_loss` (the trackers get `eval/cloze_acc`), as documented:
    a sweep metric `eval/cloze_acc` is read from it."""
    a = run(tmp_path, "a", [(1, 9.0)], [(2, 5.0)])
    b = run(tmp_path, "b", [(1, 9.0)], [(2, 5.5)])
    for d, acc in ((a, 0.25), (b, 0.5)):
        with open(f"{d}/metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": 2, "val_loss": 5.0, "val_ppl": 148.0, "cloze_acc": acc}) + "\n")
    state(tmp_path, [("t0", 0.0, a), ("t1", 0.1, b)], metric="eval/cloze_acc", goal="maximize")
    best = summarize(tmp_path, say=lambda *x: None)
    assert best["trial"] == "t1" and best["final"] == 0.5


def test_train_ppl_is_exp_of_the_lm_loss_as_the_trackers_get_it(tmp_path):
    """metrics.jsonl has no `ppl`: the trackers' `train/ppl` is exp of the LM loss (`lm_loss` under a penalty,
    else `loss`), so a sweep metric train/ppl ranks the trials by it."""
    a = run(tmp_path, "a", [(1, 9.0), (2, 4.0)], [(2, 5.0)])
    b = run(tmp_path, "b", [(1, 9.0)], [(2, 5.5)])
    with open(f"{b}/metrics.jsonl", "a") as f:  # penalized: loss 4.5 with the penalty, the LM's 3.0
        f.write(json.dumps({"step": 2, "loss": 4.5, "lm_loss": 3.0, "penalty": 1.5, "tokens_per_sec": 1.0}) + "\n")
    state(tmp_path, [("t0", 0.0, a), ("t1", 0.1, b)], metric="train/ppl")
    best = summarize(tmp_path, say=lambda *x: None)
    assert best["trial"] == "t1" and best["final"] == pytest.approx(math.exp(3.0))
    assert "| t0 | 0 | 5 | 5 | 54.6 |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "train_ppl_vs_penalty_weight.png").read_bytes()[:8] == PNG
