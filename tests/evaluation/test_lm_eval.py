"""lm-eval-harness on a Llama export, in-process, with a local task YAML over the bundled cloze file:
its per-choice log-likelihoods are `yxanul eval`'s, and so are acc/acc_norm."""

import pytest

from yxanul.evaluation.tasks import ending_logprobs, load_task
from yxanul.hub.export import export

pytestmark = pytest.mark.slow
N = 4

def test_lm_eval_simple_evaluate_agrees_with_yxanul_eval(tok_run, tmp_path, cloze_task_dir):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from yxanul.evaluation.tasks import score_task

    run, _ = tok_run
    llama = export(run, tmp_path / "llama", dtype="fp32")
    r = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={llama},dtype=float32", tasks=["yxanul_cloze"],
                                task_manager=TaskManager(include_path=str(cloze_task_dir)), limit=N,
                                device="cpu", batch_size=4, log_samples=True)
    samples = sorted(r["samples"]["yxanul_cloze"], key=lambda s: s["doc_id"])
    model = AutoModelForCausalLM.from_pretrained(str(llama)).eval()
    tok = AutoTokenizer.from_pretrained(str(llama))
    items = load_task("cloze", N)
    for s, it in zip(samples, items):
        theirs = [float(resp[0][0]) for resp in s["resps"]]
        ours = ending_logprobs(model, tok, it["ctx"], it["endings"], "cpu", 2048)
        assert ours == pytest.approx(theirs, abs=1e-3)
    res, mine = r["results"]["yxanul_cloze"], score_task(model, tok, items, "cpu")
    assert res["acc,none"] == pytest.approx(mine["acc"]) and res["acc_norm,none"] == pytest.approx(mine["acc_norm"])
