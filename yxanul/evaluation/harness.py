"""Benchmarks by name through lm-eval-harness: ``simple_evaluate`` on the in-memory model.

``yxanul eval MODEL --tasks hellaswag,arc_easy,arc_challenge,piqa,lambada_openai,mmlu,medqa_4options``
hands the model (a run or checkpoint as the ``LlamaForCausalLM`` with the same weights,
:mod:`yxanul.integrations.causal_lm`) to lm-eval's ``HFLM(pretrained=<model instance>, tokenizer=...)``:
the task definitions, prompts, few-shot handling and metrics are lm-eval's own, so the numbers are the
ones the lm-eval CLI reports for an export of the same model. The built-in tasks read their datasets from
the Hub (cached by ``datasets`` after the first run); ``--task_dir`` adds local task YAMLs (lm-eval's
``include_path``), e.g. over a local json file (``dataset_path: json`` + ``dataset_kwargs.data_files``).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path

from ..data.sources import hub_unreachable_why
from ..errors import DataError, first_line
from .args import BUNDLED

SUGGESTED = ("hellaswag", "arc_easy", "arc_challenge", "piqa", "lambada_openai", "mmlu", "medqa_4options")


def task_manager(names: list[str], task_dir: str | None = None):
    """lm-eval's TaskManager that knows ``names``: only ``task_dir`` when it defines them all (indexing the
    ~10k built-in task files takes seconds), else the built-in tasks too. An unknown name: one line."""
    from lm_eval.tasks import TaskManager

    if task_dir is not None:
        if not Path(task_dir).is_dir():
            raise DataError(f"task_dir '{task_dir}': no such directory (expected a folder of lm-eval task YAMLs)")
        tm = TaskManager(include_path=str(task_dir), include_defaults=False)
        if all(n in tm.all_tasks for n in names):
            return tm
    tm = TaskManager(include_path=str(task_dir) if task_dir else None)
    for n in names:
        if n not in tm.all_tasks:
            raise DataError(f"task '{n}': not 'cloze', a .jsonl file, nor an lm-eval task ({_hint(n, tm.all_tasks)})")
    return tm


def _hint(name: str, tasks) -> str:
    """'did you mean ...?': a suggested task the name begins (medqa -> medqa_4options, arc -> arc_easy or
    arc_challenge; the nearest spelling among lm-eval's ~10k names is another benchmark there: medmcqa, arc_zh),
    else the nearest bundled task or lm-eval task, else the suggested list."""
    starts = [t for t in SUGGESTED if t.startswith(name.lower())]
    close = starts or difflib.get_close_matches(name, list(BUNDLED), n=1) or difflib.get_close_matches(name, tasks, n=1)
    return "did you mean " + " or ".join(f"'{c}'" for c in close) + "?" if close else f"e.g. {', '.join(SUGGESTED)}"


def evaluate_harness(model, tokenizer, names: list[str], tm, limit: int | None = None, batch_size: int = 8,
                     num_fewshot: int | None = None, bootstrap_iters: int = 100000) -> dict[str, dict]:
    """{task: {metric: value}} for each of ``names`` (and a group's subtasks) by lm-eval's simple_evaluate on
    ``model`` as it is in memory (kept in its train/eval mode afterwards). Metric keys drop lm-eval's
    ``,none`` filter suffix: ``acc``, ``acc_norm``, ``acc_stderr``, ``perplexity``; ``n`` = items scored."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    was_training = model.training
    model.eval()
    try:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        r = lm_eval.simple_evaluate(model=lm, tasks=list(names), task_manager=tm, limit=limit,
                                    num_fewshot=num_fewshot, bootstrap_iters=bootstrap_iters, log_samples=False)
    except ConnectionError as e:  # datasets: "Couldn't reach 'allenai/ai2_arc' on the Hub (OfflineModeIsEnabled)"
        line = first_line(e, type(e).__name__)
        raise DataError(f"tasks {','.join(names)}: dataset '{_dataset_named(line)}' is not in the HF cache and the "
                        f"Hub cannot be asked ({line[:160]}); run the task once where the Hub is reachable (datasets "
                        "keeps it under HF_HOME, which offline runs then read), or give local task YAMLs with "
                        "--task_dir") from None
    finally:
        model.train(was_training)
    return {task: _metrics(values, r.get("n-samples", {}).get(task)) for task, values in r["results"].items()}


def datasets_from_the_cache_if_the_hub_is_unreachable(say=print) -> None:
    """lm-eval's tasks load their datasets by name: with the Hub unreachable (one TCP probe) and offline mode unset,
    datasets would retry for ~40 s per dataset before failing, even for a cached copy. Set HF_DATASETS_OFFLINE
    before datasets is imported (it reads the variable once, at import): cached datasets load at once, others
    fail fast in one line (`evaluate_harness`). Nothing changes once datasets is imported or offline mode is set."""
    if "datasets" in sys.modules or os.environ.get("HF_DATASETS_OFFLINE"):
        return
    why = hub_unreachable_why()
    if why:
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        say(f"the Hugging Face Hub is unreachable ({why}): lm-eval's datasets come from the HF cache only "
            "(HF_DATASETS_OFFLINE=1 for this run)")


def _dataset_named(line: str) -> str:
    """'Couldn't reach 'allenai/ai2_arc' on the Hub' -> 'allenai/ai2_arc' (the quoted name after "reach": the
    message's own apostrophe comes first)."""
    m = re.search(r"reach '([^']+)'", line)
    return m.group(1) if m else "?"


def _metrics(values: dict, n_samples: dict | None) -> dict:
    out = {k.split(",")[0]: v for k, v in values.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if n_samples:
        out["n"] = n_samples.get("effective")
    return out


def headline(metrics: dict) -> str:
    """'acc 0.2500 | acc_norm 0.3000 (40 items)' (stderr and sample counts left to the JSON)."""
    shown = [f"{k} {v:.4f}" for k, v in metrics.items() if k not in ("n", "sample_len") and not k.endswith("_stderr")]
    n = f" ({metrics['n']} items)" if metrics.get("n") else ""
    return " | ".join(shown) + n


def split_tasks(tasks: list[str] | None) -> tuple[list[str], list[str]]:
    """(yxanul's own tasks: 'cloze' and HellaSwag-format files, lm-eval task names); commas separate names
    too, so ``--tasks hellaswag,arc_easy cloze`` works."""
    local, harness = [], []
    for t in (n for arg in tasks or [] for n in arg.split(",") if n):
        is_local = t in BUNDLED or t.endswith((".jsonl", ".json")) or Path(t).is_file()
        (local if is_local else harness).append(t)
    return local, harness
