"""`yxanul eval MODEL [--data_dir D] [--tasks cloze FILE.jsonl ...] [--limit N]`.

MODEL: a run directory, checkpoint or export (Llama or yxanul format: any HF causal LM). Prints, and
with ``--output`` writes as JSON: validation loss/perplexity on the prepared shards' ``val`` split
(the run's own data folder by default) and accuracy / acc_norm on each multiple-choice task.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checkpoint import list_checkpoints, saved_config
from ..data.args import DataArgs
from ..data.loader import eval_batches
from ..data.prepare import target_dir
from ..errors import ConfigError, DataError, UserError, require
from ..flags import check_same_as, parse_command, same_as
from ..hub.loading import device_of, is_export, load_model
from ..integrations.causal_lm import as_llama, with_pad_token
from ..tracking import TrackingArgs
from .harness import (
    datasets_from_the_cache_if_the_hub_is_unreachable,
    evaluate_harness,
    headline,
    split_tasks,
    task_manager,
)
from .tasks import load_task, score_task, task_name

DEFAULT_BATCH_SIZE = 8  # --batch_size of an export, which has no run config
TRAINER_EVAL_STEPS = TrackingArgs.__dataclass_fields__["eval_steps"].default


@torch.no_grad()
def val_loss(model, data_dir, seq_length: int, batch_size: int, steps: int, device) -> dict[str, float]:
    """Mean cross entropy over fixed validation windows (the trainer's eval_batches), from the logits, so
    any causal LM (a Llama export included) is scored the same way."""
    total, n = 0.0, 0
    for x, y in eval_batches(data_dir, seq_length, batch_size, steps):                 # (B, T) each
        logits = model(input_ids=x.to(device)).logits.float()                          # (B, T, V)
        total += F.cross_entropy(logits.view(-1, logits.size(-1)), y.to(device).reshape(-1)).item()
        n += 1
    loss = total / max(n, 1)
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50)), "val_batches": n}


def run_config_of(model_path: str) -> dict:
    """The flat config.yaml of the run behind MODEL: a run's own, else its newest checkpoint's, or a checkpoint's;
    {} for an export. Only its data and evaluation settings are read (the weights were verified by load_model)."""
    if is_export(model_path):
        return {}
    found = [Path(model_path)] + [Path(c["path"]) for c in reversed(list_checkpoints(model_path))]
    return next((cfg for cfg in map(saved_config, found) if cfg), {})


def data_dir_of(model_path: str) -> Path | None:
    """The prepared data folder of the run behind MODEL (None for an export)."""
    cfg = run_config_of(model_path)
    if not cfg:
        return None
    keys = {k: cfg[k] for k in DataArgs.__dataclass_fields__ if k in cfg}
    try:
        return Path(keys.get("data_dir") or target_dir(DataArgs(**keys))[0])
    except Exception:  # noqa: BLE001 - the run's source data is not here: no default validation set
        return None


def with_run_defaults(a: EvalCommand) -> EvalCommand:
    """--batch_size / --eval_steps left out: the run's micro_batch_size / eval_steps, so that the validation loss
    is over the trainer's own windows (the first micro_batch_size x eval_steps of the split); an export, or a
    config without them: 8 and the trainer's default eval_steps."""
    cfg = run_config_of(a.model)

    def saved(key: str, default: int) -> int:
        v = cfg.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else default

    return replace(a, batch_size=a.batch_size or saved("micro_batch_size", DEFAULT_BATCH_SIZE),
                      eval_steps=a.eval_steps or saved("eval_steps", TRAINER_EVAL_STEPS))


@dataclass
class EvalCommand:
    """Evaluate a run, checkpoint or export: validation loss/perplexity and multiple-choice accuracy."""

    model: str = field(metadata={"positional": True, "help": "Run directory, checkpoint folder or export folder."})
    data_dir: str | None = field(default=None, metadata={
        "help": "Prepared data folder for validation loss (default: the run's own; none for an export)."})
    tasks: list[str] | None = field(default=None, metadata={
        "help": "Tasks: 'cloze' (bundled), HellaSwag-format .jsonl files, and/or lm-eval task names, comma- or "
                "space-separated (hellaswag,arc_easy,arc_challenge,piqa,lambada_openai,mmlu,medqa_4options; run "
                "by lm-eval's simple_evaluate on the model in memory)."})
    task_dir: str | None = field(default=None, metadata={
        "help": "Folder of lm-eval task YAMLs (lm-eval's include_path), e.g. tasks over local json files."})
    num_fewshot: int | None = field(default=None, metadata={
        "help": "Few-shot examples for the lm-eval tasks (default: each task's own, mostly 0)."})
    limit: int | None = field(default=None, metadata={"help": "At most N items per task."})
    seq_length: int | None = field(default=None, metadata={"help": "Validation window (default and at most: "
                                                                   "the model's max_position_embeddings)."})
    batch_size: int | None = field(default=None, metadata={
        "help": f"Validation windows per forward pass (default: the run's micro_batch_size; {DEFAULT_BATCH_SIZE} for "
                "an export)."})
    eval_steps: int | None = same_as(TrackingArgs, "eval_steps", default=None)
    device: str = field(default="auto", metadata={"help": "auto (cuda if available), cpu or cuda[:N]."})
    output: str | None = field(default=None, metadata={"help": "Also write the results to this JSON file."})

    def __post_init__(self):
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise ConfigError("num_fewshot", "an integer >= 0", self.num_fewshot)
        for key in ("limit", "seq_length"):
            v = getattr(self, key)
            if v is not None and v < 1:
                raise ConfigError(key, "an integer >= 1", v)
        check_same_as(self)
        for key in ("batch_size",):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(key, "an integer >= 1", getattr(self, key))
        device_of(self.device)
        if self.output is not None:
            _check_output(Path(self.output))


WRITTEN_BY = "yxanul eval"  # in every results JSON: the one kind of existing file --output may replace


def _check_output(out: Path) -> None:
    """--output, before the evaluation runs: a JSON file in an existing folder, outside any checkpoints folder
    (a file there would change a checkpoint), and new or an earlier result: any other file (a run's config.yaml,
    a checkpoint's trainer_state.json) is never overwritten."""
    if not out.parent.is_dir() or out.is_dir():
        raise ConfigError("output", "a JSON file in an existing folder (checked before the evaluation runs)", str(out))
    if "checkpoints" in (p.name for p in out.absolute().parents):
        raise ConfigError("output", "a file outside a run's checkpoints folder (a file there changes a checkpoint)",
                          str(out))
    if out.is_file():
        try:
            earlier = json.loads(out.read_text()).get("written_by") == WRITTEN_BY
        except (OSError, ValueError, AttributeError):
            earlier = False
        if not earlier:
            raise ConfigError("output", "a new file or an earlier `yxanul eval` result (this file is neither: it "
                                        "is left as it is)", str(out))


def evaluate(a: EvalCommand, say=print) -> dict:
    if not Path(a.model).exists():  # before "nothing to evaluate", which would blame a missing data folder
        raise UserError(f"MODEL '{a.model}': no such file or directory")
    local, harness = split_tasks(a.tasks)
    for key in ("num_fewshot", "task_dir"):  # lm-eval's settings: with no lm-eval task they would change nothing
        if getattr(a, key) is not None and not harness:
            raise ConfigError(key, "lm-eval tasks in --tasks to apply to (the bundled cloze and .jsonl tasks are "
                                   "zero-shot)", getattr(a, key))
    if harness:
        require("lm_eval", "eval", f"--tasks {','.join(harness)} (lm-eval's)")
        datasets_from_the_cache_if_the_hub_is_unreachable(say)
    a = with_run_defaults(a)
    tasks = {task_name(t): load_task(t, a.limit) for t in local}  # bad task files and names fail before loading
    tm = task_manager(harness, a.task_dir) if harness else None
    device = device_of(a.device)
    data_dir = _validation_data(a, tasks or harness, say)  # nothing to do is one line before the model loads
    model, tok = load_model(a.model, device)
    positions = int(model.config.max_position_embeddings)
    if a.seq_length is not None and a.seq_length > positions:  # past them the loss is of no trained model
        raise ConfigError("seq_length", f"at most the model's {positions} positions (max_position_embeddings)",
                          a.seq_length)
    results: dict = {"written_by": WRITTEN_BY, "model": a.model}
    if data_dir is not None:
        T = a.seq_length or positions
        results.update(val_loss(model, data_dir, T, a.batch_size, a.eval_steps, device))
        say(f"val_loss: {results['val_loss']:.4f} | val_ppl: {results['val_ppl']:.2f} "
            f"({results['val_batches']} batches of {a.batch_size} x {T} tokens from {data_dir})")
    if (tasks or harness) and tok is None:
        raise DataError(f"MODEL '{a.model}': no tokenizer found for the tasks (export it with its tokenizer)")
    for name, items in tasks.items():
        r = score_task(model, tok, items, device, say=say, name=name)
        results[name] = r
        say(f"{name}: acc {r['acc']:.4f} | acc_norm {r['acc_norm']:.4f} ({r['n']} items)")
    if harness:
        results.update(_run_harness(a, model, tok, harness, tm, say))
    return results


def _run_harness(a: EvalCommand, model, tok, names: list[str], tm, say) -> dict:
    """lm-eval's tasks on the model as a transformers causal LM (a yxanul model as the same-weights Llama)."""
    out = evaluate_harness(as_llama(model), with_pad_token(tok), names, tm, a.limit, a.batch_size, a.num_fewshot)
    for name in names:  # a group's subtasks (mmlu's 57) only in the JSON output
        say(f"{name}: {headline(out[name])} (lm-eval)")
    return out


def _validation_data(a: EvalCommand, tasks: dict, say) -> Path | None:
    """The prepared folder for the validation loss (None: skipped, said in one line); a UserError when
    there is neither that nor a task."""
    data_dir = Path(a.data_dir) if a.data_dir else data_dir_of(a.model)
    if data_dir is not None and not (data_dir / "meta.json").is_file():
        if a.data_dir:
            raise DataError(f"data_dir '{data_dir}': not a prepared data folder (run `yxanul prepare` first)")
        why = f"the run's data folder {data_dir} is not prepared here"
        data_dir = None
    elif data_dir is None:
        why = f"'{a.model}' is an export or has no data folder of its own"
    if data_dir is None and not tasks:
        raise UserError(f"yxanul eval: nothing to evaluate: {why}; pass --data_dir D (a prepared folder) for the "
                        "validation loss and/or --tasks cloze FILE.jsonl")
    if data_dir is None:
        say(f"validation loss skipped: {why} (--data_dir D for it)")
    return data_dir


def main(argv: list[str] | None = None) -> int:
    a = parse_command(EvalCommand, argv, prog="yxanul eval")
    results = evaluate(a)
    if a.output:
        Path(a.output).write_text(json.dumps(results, indent=2))
    return 0
