"""Multiple-choice tasks in HellaSwag's format, scored by log-likelihood like lm-eval-harness / llm.c.

An item is ``{"ctx": str, "endings": [str, ...], "label": int}`` (HellaSwag's own jsonl, llm.c's
``hellaswag_val.jsonl`` and HF's ``Rowan/hellaswag`` rows all have these fields; ``label`` may be a
string digit). For every ending the model scores ``log p(ending | ctx)`` summed over the ending's tokens:
``acc`` picks the largest sum, ``acc_norm`` the largest sum divided by the ending's length in
characters (lm-eval's ``acc_norm``, its HellaSwag headline number). Tokenization follows lm-eval exactly
(:func:`encode_pair`), so a model's scores here and under lm-eval-harness agree (tests/evaluation).

Why not the ``evaluate`` library: ``evaluate.load("accuracy")`` downloads the metric's script from the
Hub at first use (it fails offline and in CI here; it comes only with the ``eval`` extra, as a dependency
of lm-eval); an accuracy is one comparison per item, so it is computed here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import DataError
from ..integrations.causal_lm import as_llama, with_pad_token
from ..tracking import format_duration
from .args import BUNDLED
from .harness import evaluate_harness, split_tasks, task_manager


def task_name(task: str) -> str:
    """'cloze' -> 'cloze'; 'path/to/hellaswag_val.jsonl' -> 'hellaswag_val'."""
    return task if task in BUNDLED else Path(task).name.split(".")[0]


def load_task(task: str, limit: int | None = None) -> list[dict]:
    """Items of a bundled task or a HellaSwag-format .jsonl file (the first ``limit`` of them)."""
    path = BUNDLED.get(task, Path(task))
    if not path.is_file():
        what = ("no such file" if task.endswith(".jsonl") else
                f"not a bundled task ({', '.join(BUNDLED)}) nor a .jsonl file")
        raise DataError(f"task '{task}': {what}")
    items = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            if limit is not None and len(items) >= limit:
                break
            items.append(_item(path, i, line))
    if not items:
        raise DataError(f"task '{task}': {path} has no items")
    return items


def _index(label) -> int:
    """HellaSwag's label: an int, or the string of one (HF's Rowan/hellaswag); a bool, a fraction: ValueError."""
    if isinstance(label, bool) or not isinstance(label, (int, str)):
        raise ValueError(label)
    return int(label)


def _item(path: Path, i: int, line: str) -> dict:
    try:
        row = json.loads(line)
        ctx, endings, label = row["ctx"], row["endings"], _index(row["label"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise DataError(f"{path}:{i}: expected a JSON object with ctx (text), endings (list of text) and "
                        "label (index of the true ending)") from None
    if not (isinstance(ctx, str) and isinstance(endings, list) and len(endings) >= 2
            and all(isinstance(e, str) and e for e in endings) and 0 <= label < len(endings)):
        raise DataError(f"{path}:{i}: ctx must be text, endings a list of >= 2 non-empty texts, label an index "
                        "into endings")
    return {"ctx": ctx, "endings": endings, "label": label}


def encode_pair(tokenizer, ctx: str, ending: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) exactly as lm-eval's ``_encode_pair``: the continuation is
    ``" " + ending`` (its HellaSwag target delimiter) unless ``ctx`` ends in whitespace, whose trailing
    whitespace then moves into the continuation; the pair is tokenized whole and split after the context."""
    cont = ending if not ctx or ctx[-1].isspace() else " " + ending
    stripped = ctx.rstrip()
    cont, ctx = ctx[len(stripped):] + cont, stripped
    ctx_ids = tokenizer(ctx, add_special_tokens=False).input_ids
    whole = tokenizer(ctx + cont, add_special_tokens=False).input_ids
    if not ctx_ids:  # nothing to condition on: start from end-of-text, as lm-eval does
        return [tokenizer.eos_token_id], whole
    return ctx_ids, whole[len(ctx_ids):]


@torch.no_grad()
def ending_logprobs(model, tokenizer, ctx: str, endings: list[str], device, max_len: int) -> list[float]:
    """Sum of log p(ending tokens | ctx) for each ending: one forward pass over all endings (right padded;
    padding sits after every scored position, so causal attention never sees it). A pair longer than the
    window is cropped as lm-eval's HFLM crops it: its last ``max_len + 1`` tokens less the last one (only ever
    predicted), so the ending's first token keeps a predecessor and the scores stay lm-eval's. An ending longer
    than the window cannot be scored whole: a DataError (lm-eval refuses it too)."""
    rows, ends = [], []
    for e in endings:
        ctx_ids, end_ids = encode_pair(tokenizer, ctx, e)
        if len(end_ids) > max_len:
            raise DataError(f"an ending of {len(end_ids)} tokens is longer than the model's {max_len}-token window")
        rows.append((ctx_ids + end_ids)[-(max_len + 1):][:-1])  # context >= 1 token: the ending is all scored
        ends.append(end_ids)
    width = max(len(r) for r in rows)
    pad = tokenizer.eos_token_id or 0
    x = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)  # (N, T)
    logp = F.log_softmax(model(input_ids=x).logits.float(), dim=-1)               # (N, T, V)
    out = []
    for n, (row, end) in enumerate(zip(rows, ends)):
        a = len(row) - len(end)  # the position whose logits predict the ending's first token
        targets = torch.tensor(end, device=device)[:, None]
        out.append(logp[n, a:len(row)].gather(-1, targets).sum().item())
    return out


def length_normalized(logprobs: list[float], endings: list[str]) -> list[float]:
    """acc_norm's scores as lm-eval computes them: each ending's log-likelihood over ``len(choice)`` in characters
    (the choice as the task gives it: the target delimiter, a space, is not counted)."""
    return [v / max(1, len(e)) for v, e in zip(logprobs, endings, strict=True)]


PROGRESS_EVERY_S = 10.0  # `yxanul eval`: a progress line per task at most this far apart


def score_task(model, tokenizer, items: list[dict], device, say=None, name: str = "task") -> dict[str, float]:
    """{'acc', 'acc_norm', 'n'} of ``model`` on ``items`` (model in eval mode). ``say``: a progress line
    (``cloze: 120/500 items 24% eta 40s``) every ``PROGRESS_EVERY_S`` seconds."""
    max_len = int(getattr(model.config, "max_position_embeddings", 2048))
    correct = correct_norm = 0
    t0 = last = time.perf_counter()
    for i, it in enumerate(items):
        if say is not None and i and time.perf_counter() - last > PROGRESS_EVERY_S:
            last = time.perf_counter()
            eta = (last - t0) / i * (len(items) - i)
            say(f"{name}: {i}/{len(items)} items {i / len(items):.0%} eta {format_duration(eta)}", flush=True)
        try:
            lp = ending_logprobs(model, tokenizer, it["ctx"], it["endings"], device, max_len)
        except DataError as e:
            raise DataError(f"task '{name}' item {i + 1}: {e}") from None
        norm = length_normalized(lp, it["endings"])
        correct += int(max(range(len(lp)), key=lp.__getitem__) == it["label"])
        correct_norm += int(max(range(len(norm)), key=norm.__getitem__) == it["label"])
    n = len(items)
    return {"acc": correct / n, "acc_norm": correct_norm / n, "n": n}


class EvalTasksCallback:
    """Benchmark tasks at each evaluation during training (``--eval_tasks``).

    The trainer calls ``on_evaluate(trainer)`` on the main process after its validation loss; the
    returned ``{"eval/<task>_acc": ..., "eval/<task>_acc_norm": ...}`` go into metrics.jsonl and the
    trackers. ``trainer`` needs ``model`` (unwrapped if it has an ``accelerator``), ``tokenizer`` and a
    device (``accelerator.device`` or ``device``); ``evaluate(model, tokenizer, device)`` is the same
    without a trainer. Items of yxanul's own tasks are read once (``eval_tasks_limit`` of each task);
    lm-eval task names are checked once here and run by lm-eval on the same-weights Llama of the model
    (a copy of the weights for the duration of the evaluation; no stderr bootstrap)."""

    def __init__(self, tasks_args):
        local, self.harness = split_tasks(tasks_args.eval_tasks)
        self.limit = tasks_args.eval_tasks_limit
        self.tasks = {task_name(t): load_task(t, self.limit) for t in local}
        self.task_manager = task_manager(self.harness, tasks_args.eval_task_dir) if self.harness else None

    def on_evaluate(self, trainer) -> dict[str, float]:
        acc = getattr(trainer, "accelerator", None)
        model = acc.unwrap_model(trainer.model) if acc is not None else trainer.model
        device = acc.device if acc is not None else getattr(trainer, "device", "cpu")
        return self.evaluate(model, trainer.tokenizer, device)

    def evaluate(self, model, tokenizer, device) -> dict[str, float]:
        was_training = model.training
        model.eval()
        try:
            out = {}
            for name, items in self.tasks.items():
                r = score_task(model, tokenizer, items, device, name=name)
                out[f"eval/{name}_acc"], out[f"eval/{name}_acc_norm"] = r["acc"], r["acc_norm"]
            if self.harness:
                out.update(self._harness(model, tokenizer))
            return out
        finally:
            model.train(was_training)

    def _harness(self, model, tokenizer) -> dict[str, float]:
        res = evaluate_harness(as_llama(model), with_pad_token(tokenizer), self.harness, self.task_manager,
                               self.limit, bootstrap_iters=0)
        return {f"eval/{task}_{k}": float(v) for task in self.harness for k, v in res[task].items()
                if k not in ("n", "sample_len") and not k.endswith("_stderr")}
