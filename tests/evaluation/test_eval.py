"""`yxanul eval`: log-likelihood scoring checked against a plain per-ending computation, acc/acc_norm by
their definitions, validation loss equal to the model's own loss, the bundled cloze task, the callback."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from yxanul.cli import main as cli
from yxanul.errors import DataError
from yxanul.evaluation.run import val_loss
from yxanul.evaluation.tasks import BUNDLED, EvalTasksCallback, ending_logprobs, load_task, score_task
from yxanul.hub.export import export

ROOT = Path(__file__).resolve().parents[2]
ITEMS = [{"ctx": "JULIET:\nO Romeo, Romeo, wherefore art thou",
          "endings": ["Romeo?", "a", "the king of all the land and sea, and more besides"], "label": 0},
         {"ctx": "HAMLET:\n", "endings": ["To be, or not to be", "xq"], "label": 1}]


def reference_logprob(model, tok, ctx, ending):
    """Independent: one unpadded sequence per ending, token by token (lm-eval's split of the pair)."""
    from yxanul.evaluation.tasks import encode_pair

    c, e = encode_pair(tok, ctx, ending)
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([c + e])).logits[0].float(), -1)
    return sum(logp[len(c) + i - 1, t].item() for i, t in enumerate(e))


def test_scores_match_a_plain_computation_and_the_definitions(tok_run, prepared):
    _, model = tok_run
    tok = AutoTokenizer.from_pretrained(str(prepared / "tokenizer"))
    for it in ITEMS:
        lp = ending_logprobs(model, tok, it["ctx"], it["endings"], "cpu", 64)
        ref = [reference_logprob(model, tok, it["ctx"], e) for e in it["endings"]]
        assert lp == pytest.approx(ref, abs=1e-4)
    # label = the model's own choice under each rule -> accuracy 1; the other way round -> 0
    lp = [ending_logprobs(model, tok, it["ctx"], it["endings"], "cpu", 64) for it in ITEMS]
    best = [max(range(len(v)), key=v.__getitem__) for v in lp]
    norm = [[s / len(e) for s, e in zip(v, it["endings"])] for v, it in zip(lp, ITEMS)]
    best_norm = [max(range(len(v)), key=v.__getitem__) for v in norm]
    r = score_task(model, tok, [dict(it, label=b) for it, b in zip(ITEMS, best)], "cpu")
    assert r["acc"] == 1.0 and r["n"] == 2
    assert r["acc_norm"] == sum(b == bn for b, bn in zip(best, best_norm)) / 2
    r = score_task(model, tok, [dict(it, label=b) for it, b in zip(ITEMS, best_norm)], "cpu")
    assert r["acc_norm"] == 1.0


def test_acc_norm_divides_by_the_endings_characters_as_lm_eval_does():
    """lm-eval's acc_norm: log-likelihood / len(choice), the delimiter's space not counted. Here counting it
    (or tokens) would pick the other ending: -4 / 1 < -8.2 / 3, but -4 / 2 > -8.2 / 4."""
    from yxanul.evaluation.tasks import length_normalized

    scores = length_normalized([-4.0, -8.2], ["a", "abc"])
    assert scores == pytest.approx([-4.0, -8.2 / 3]) and max(range(2), key=scores.__getitem__) == 1


def test_the_harness_model_is_a_llama_whose_tokenizer_pads_a_batch(tok_run):
    """`load_causal_lm` (what the harness scores): a plain LlamaForCausalLM with the run's logits, and a tokenizer
    that pads (the bundled one has no pad token: eos pads, masked out), so lm-eval's batches of 2+ work."""
    from yxanul.integrations.causal_lm import load_causal_lm

    run, model = tok_run
    llama, tok = load_causal_lm(run)
    assert type(llama).__name__ == "LlamaForCausalLM" and tok.pad_token == tok.eos_token
    batch = tok(["JULIET:", "HAMLET:\nTo be, or not to be"], return_tensors="pt", padding=True)
    keep = batch.attention_mask.bool()
    assert not keep.all()  # the short prompt was padded
    with torch.no_grad():
        got, ref = llama(**batch).logits, model(**batch).logits
    assert (got[keep] - ref[keep]).abs().max().item() <= 1e-4


def test_val_loss_is_the_models_loss_and_the_export_agrees(tok_run, prepared, tmp_path):
    from yxanul.data.loader import eval_batches
    from yxanul.hub.loading import load_model

    run, model = tok_run
    got = val_loss(model, prepared, 32, 2, 3, "cpu")
    with torch.no_grad():
        losses = [model(x, shift_labels=y).loss.item() for x, y in eval_batches(prepared, 32, 2, 3)]
    assert got["val_batches"] == len(losses) == 3
    assert got["val_loss"] == pytest.approx(sum(losses) / 3, rel=1e-6)
    llama, _ = load_model(export(run, tmp_path / "llama", dtype="fp32"))
    assert val_loss(llama, prepared, 32, 2, 3, "cpu")["val_loss"] == pytest.approx(got["val_loss"], abs=1e-5)


def test_eval_cli_on_a_run_and_on_a_users_hellaswag_file(tok_run, tmp_path, capsys):
    run, _ = tok_run
    hs = tmp_path / "hellaswag_val.jsonl"  # HF Rowan/hellaswag rows carry the label as a string
    hs.write_text("\n".join(json.dumps(dict(it, label=str(it["label"]), activity_label="x")) for it in ITEMS))
    out = tmp_path / "r.json"
    assert cli(["eval", str(run), "--tasks", "cloze", str(hs), "--limit", "3", "--seq_length", "32",
                "--eval_steps", "2", "--batch_size", "2", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["cloze"]["n"] == 3 and r["hellaswag_val"]["n"] == 2 and r["val_batches"] == 2
    assert f"cloze: acc {r['cloze']['acc']:.4f}" in printed and "val_loss:" in printed
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ctx": "a", "endings": ["b", "c"], "label": 0}\n{"ctx": "a", "endings": ["b"], "label": 3}\n')
    assert cli(["eval", str(run), "--tasks", str(bad)]) == 2
    assert cli(["eval", str(run), "--tasks", "mmlu"]) == 2
    assert cli(["eval", str(run), "--data_dir", str(tmp_path)]) == 2
    assert cli(["eval", str(run), "--output", str(tmp_path / "missing" / "r.json")]) == 2  # before evaluating
    assert cli(["eval", str(run), "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and f"{bad}:2:" in err[0] and "mmlu" in err[1] and "prepared" in err[2], err
    assert all("config key 'output': expected a JSON file in an existing folder" in e for e in err[3:]), err
    # an earlier result is replaced; any other file (a run's config.yaml, a checkpoint's state) is never written
    assert cli(["eval", str(run), "--eval_steps", "1", "--seq_length", "32", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["written_by"] == "yxanul eval" and "cloze" not in json.loads(out.read_text())
    ckpt = next((run / "checkpoints").glob("step_*"))
    (tmp_path / "mine.json").write_text('{"a": 1}')  # e.g. a run's config, another tool's JSON
    for target in (tmp_path / "mine.json", ckpt / "trainer_state.json", ckpt / "results.json"):
        before = target.read_bytes() if target.exists() else None
        assert cli(["eval", str(run), "--eval_steps", "1", "--output", str(target)]) == 2, target
        assert (target.read_bytes() if target.exists() else None) == before
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "a new file or an earlier `yxanul eval` result" in err[0], err
    assert all("outside a run's checkpoints folder" in e for e in err[1:]), err


def test_eval_of_an_export_says_what_it_skips_and_refuses_nothing_to_do(tok_run, tmp_path, capsys, monkeypatch):
    """An export has no data folder: with tasks, one line says the validation loss is skipped; with neither
    --data_dir nor --tasks, one line and exit 2 before the model loads. Tasks print progress lines."""
    import yxanul.evaluation.tasks as tasks

    run, _ = tok_run
    exp = export(run, tmp_path / "llama", dtype="fp32")
    assert cli(["eval", str(exp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to evaluate" in err[0] and "--data_dir D" in err[0] and "--tasks" in err[0]
    monkeypatch.setattr(tasks, "PROGRESS_EVERY_S", 0.0)  # a progress line before every item but the first
    assert cli(["eval", str(exp), "--tasks", "cloze", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert f"validation loss skipped: '{exp}' is an export or has no data folder of its own" in out
    assert "cloze: 1/3 items 33% eta " in out and "cloze: 2/3 items 67% eta " in out and "cloze: acc " in out


LONG_CTX = "ROMEO:\n" + " ".join(["But soft, what light through yonder window breaks? It is the east, and Juliet "
                                    "is the sun."] * 12)


def ending_of(tok, ctx: str, n: int) -> str:
    """A text whose continuation after ``ctx`` is exactly ``n`` tokens (lm-eval's split of the pair)."""
    from yxanul.evaluation.tasks import encode_pair

    words = ("Arise, fair sun, and kill the envious moon, who is already sick and pale with grief " * 20).split()
    for k in range(1, len(words)):
        if len(encode_pair(tok, ctx, " ".join(words[:k]))[1]) == n:
            return " ".join(words[:k])
    text = " ".join(words)
    return next(text[:c] for c in range(1, len(text)) if len(encode_pair(tok, ctx, text[:c])[1]) == n)


def test_items_longer_than_the_window_score_as_lm_eval_crops_them(tok_run, prepared, tmp_path, capsys):
    """Context + ending beyond max_position_embeddings (64 here): the sums equal lm-eval HFLM's loglikelihood
    (it keeps one more context token, never the ending's last token as an input), an ending of exactly the
    window included; a longer ending is one line naming the task and item, exit 2."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from yxanul.integrations.causal_lm import as_llama, with_pad_token

    run, model = tok_run
    tok = AutoTokenizer.from_pretrained(str(prepared / "tokenizer"))
    L = model.config.max_position_embeddings
    assert L == 64 and len(tok(LONG_CTX).input_ids) > 2 * L
    endings = ["Romeo?", "the king of all the land and sea", ending_of(tok, LONG_CTX, L)]
    ours = ending_logprobs(model, tok, LONG_CTX, endings, "cpu", L)
    lm = HFLM(pretrained=as_llama(model), tokenizer=with_pad_token(tok), batch_size=1)
    theirs = [ll for ll, _ in lm.loglikelihood([Instance("loglikelihood", {}, (LONG_CTX, " " + e), i)
                                                for i, e in enumerate(endings)], disable_tqdm=True)]
    assert ours == pytest.approx(theirs, abs=1e-4)
    fits, too_long = tmp_path / "fits.jsonl", tmp_path / "too_long.jsonl"
    fits.write_text(json.dumps({"ctx": LONG_CTX, "endings": endings, "label": 2}))
    too_long.write_text(json.dumps({"ctx": LONG_CTX, "endings": ["Romeo?", ending_of(tok, LONG_CTX, L + 1)],
                                    "label": 0}))
    out = tmp_path / "r.json"
    assert cli(["eval", str(run), "--tasks", str(fits), "--eval_steps", "1", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["fits"]["n"] == 1
    capsys.readouterr()
    assert cli(["eval", str(run), "--tasks", str(too_long), "--eval_steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: task 'too_long' item 1: an ending of {L + 1} tokens is longer than the model's "
                   f"{L}-token window"], err


def test_eval_of_a_run_uses_the_trainers_validation_windows(fast, prepared, tmp_path, capsys, monkeypatch):
    """Without --batch_size / --eval_steps, `yxanul eval RUN` takes the run's micro_batch_size and eval_steps
    from its config.yaml: the validation loss the trainer logged at its last step, over the same windows."""
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    assert cli(["train", *fast, "--data_dir", str(prepared), "--max_steps", "2", "--eval_freq", "2", "--eval_steps",
                "3", "--micro_batch_size", "4", "--seq_length", "64", "--checkpoint_freq", "2",
                "--output_dir", str(run)]) == 0
    logged = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "val_loss" in r]
    assert logged[-1]["step"] == 2
    capsys.readouterr()
    out = tmp_path / "r.json"
    assert cli(["eval", str(run), "--device", "cpu", "--output", str(out)]) == 0
    assert "(3 batches of 4 x 64 tokens from " in capsys.readouterr().out
    assert json.loads(out.read_text())["val_loss"] == pytest.approx(logged[-1]["val_loss"], abs=1e-5)


def test_eval_of_a_missing_model_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "nonexist"
    assert cli(["eval", str(missing)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: MODEL '{missing}': no such file or directory"]


def test_lm_eval_settings_without_an_lm_eval_task_are_one_line(tok_run, capsys):
    run = tok_run[0]
    """--num_fewshot and --task_dir change only lm-eval's tasks: with cloze alone they were accepted and ignored."""
    for flag in (["--num_fewshot", "2"], ["--task_dir", str(run)]):
        assert cli(["eval", str(run), "--tasks", "cloze", *flag]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: config key '{flag[0][2:]}': expected lm-eval tasks"), err


def test_a_task_file_label_that_is_no_index_and_a_missing_file_are_one_line(tmp_path):
    """A bool or a fraction as label was scored as int(label) (true: ending 1, 1.7: ending 1); the string of an
    int is HF hellaswag's own form and is read."""
    row = {"ctx": "a", "endings": ["b", "c", "d"]}
    for label in (True, 1.7):
        p = tmp_path / f"t_{label}.jsonl"
        p.write_text(json.dumps(dict(row, label=0)) + "\n" + json.dumps(dict(row, label=label)) + "\n")
        with pytest.raises(DataError, match=f"{p}:2: expected a JSON object with ctx"):
            load_task(str(p))
    p.write_text(json.dumps(dict(row, label="2")) + "\n")
    assert load_task(str(p))[0]["label"] == 2
    with pytest.raises(DataError, match=f"task '{tmp_path / 'none.jsonl'}': no such file$"):
        load_task(str(tmp_path / "none.jsonl"))


def test_bundled_cloze_task_is_the_builders_output():
    items = load_task("cloze")
    assert len(items) == 300 and all(len(it["endings"]) == 4 for it in items)
    labels = [it["label"] for it in items]
    assert all(40 <= labels.count(k) <= 110 for k in range(4))  # shuffled: no position gives it away
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_cloze_task.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert BUNDLED["cloze"].is_file()


def test_eval_tasks_callback(tok_run, prepared, tmp_path):
    from yxanul.config import parse_args

    _, model = tok_run
    tok = AutoTokenizer.from_pretrained(str(prepared / "tokenizer"))
    hs = tmp_path / "mine.jsonl"
    hs.write_text("\n".join(json.dumps(it) for it in ITEMS))
    cfg = parse_args(["--eval_tasks", "cloze", str(hs), "--eval_tasks_limit", "2"])
    cb = EvalTasksCallback(cfg.tasks)
    model.train()
    trainer = types.SimpleNamespace(model=model, tokenizer=tok, device="cpu")  # the attributes it reads
    got = cb.on_evaluate(trainer)
    assert set(got) == {"eval/cloze_acc", "eval/cloze_acc_norm", "eval/mine_acc", "eval/mine_acc_norm"}
    assert got["eval/mine_acc"] == score_task(model.eval(), tok, ITEMS, "cpu")["acc"]
    assert got["eval/cloze_acc"] in {0.0, 0.5, 1.0}
    model.train()
    cb.evaluate(model, tok, "cpu")
    assert model.training  # restored


def test_a_validation_window_longer_than_the_models_positions_is_one_line(tok_run, capsys):
    """--seq_length past max_position_embeddings (64 here) printed a perplexity of windows the model was never
    trained on, as if a result: one line naming seq_length and the positions, exit 2; the full window still runs."""
    run, model = tok_run
    L = model.config.max_position_embeddings
    assert cli(["eval", str(run), "--seq_length", str(L + 1), "--eval_steps", "1", "--batch_size", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: config key 'seq_length': expected at most the model's {L} positions (max_position_embeddings), "
        f"got {L + 1}"]
    assert cli(["eval", str(run), "--seq_length", str(L), "--eval_steps", "1", "--batch_size", "1"]) == 0
    assert f"(1 batches of 1 x {L} tokens from " in capsys.readouterr().out
