"""Multiple-choice QA in MedQA's shape (``GBaker/MedQA-USMLE-4-options``): the data, prompts and rewards of
``yxanul grpo`` / ``yxanul sft``.

A row has ``question`` (text), ``options`` (a dict letter -> text, MedQA's A-D) and ``answer_idx`` (the
true letter); ``answer`` (the true option's text) is optional. The prompt is the seed-004 pretraining
template without its answer, so a model pretrained on MedQA documents sees the same layout::

    Question: <question>
    Options:
    A. <option A>
    ...
    D. <option D>
    Answer:

and the SFT target is `` B. <option B>``. :func:`parse_answer` reads the letter a completion gives.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..data.sources import (
    check_hub_reachable,
    hub_path,
    hub_unreachable,
    resolve_source,
)
from ..data.template import render
from ..errors import DataError, first_line

BUNDLED = {"usmle_mini": Path(__file__).resolve().parents[1] / "assets" / "tasks" / "usmle_mini.jsonl"}
PROMPT = "Question: {question}\nOptions:\n{options}\nAnswer:"
# the letter a completion starts with: " B", " B.", " (B)", " B) Iron ...", "B: ..."; not "Because", nor the
# article of " A 45-year-old man ..." (how the questions begin) or the pronoun of " I think B": a letter alone
_LETTER = re.compile(r"^\s*\(?([A-Z])(?=[.):,]|\s*(?:\n|$))")


def parse_answer(completion: str) -> str | None:
    """The answer letter a completion begins with (after whitespace, an optional '('), else None."""
    m = _LETTER.match(completion)
    return m.group(1) if m else None


def prompt_of(row: dict) -> str:
    return render(PROMPT, row)


def format_reward(completions: list[str], options: list[dict], **_) -> list[float]:
    """1 when the completion begins with one of the question's option letters, else 0 (GRPO reward)."""
    return [float(parse_answer(c) in {k for k, v in o.items() if v is not None}) for c, o in zip(completions, options)]


def answer_reward(completions: list[str], answer_idx: list[str], **_) -> list[float]:
    """1 when the letter the completion begins with is the true one, else 0 (GRPO reward)."""
    return [float(parse_answer(c) == a) for c, a in zip(completions, answer_idx)]


def check_row(row: dict, where: str) -> None:
    """question text, options a dict of texts keyed by letters, answer_idx one of them: else one line."""
    opts = row.get("options")
    ok = (isinstance(row.get("question"), str) and row["question"].strip() and isinstance(opts, dict)
          and len([v for v in opts.values() if v is not None]) >= 2
          and all(isinstance(k, str) and len(k) == 1 and k.isupper() for k in opts)
          and isinstance(row.get("answer_idx"), str) and opts.get(row["answer_idx"]) is not None)
    if not ok:
        raise DataError(f"{where}: expected MedQA's columns: question (text), options (a dict of letter -> text, "
                        "e.g. {\"A\": ..., \"D\": ...}) and answer_idx (the true letter, a key of options)")


def load_qa(dataset: str, split: str = "train", name: str | None = None, limit: int | None = None):
    """A datasets.Dataset of the QA rows: the bundled ``usmle_mini``, a local .jsonl/.json/.parquet file, or a
    Hub dataset (e.g. ``GBaker/MedQA-USMLE-4-options``); every row is checked (one line for a bad one)."""
    import datasets

    src = resolve_source(str(BUNDLED.get(dataset, dataset)), split=split, name=name)
    check_hub_reachable([src])
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a QA set loads in a blink; its bars would only bury an error line
    try:
        if src.files is None:
            ds = datasets.load_dataset(hub_path(src.path), name, split=split)
        else:
            ds = datasets.load_dataset(src.builder, data_files=src.files, split="train")
    except ConnectionError as e:  # datasets: "Couldn't reach 'X' on the Hub (OfflineModeIsEnabled)"
        raise DataError(hub_unreachable(dataset, first_line(e)[:120])) from None
    except Exception as e:  # noqa: BLE001 - unknown split, bad file, ...: one line
        first = first_line(e, type(e).__name__)
        raise DataError(f"dataset '{dataset}': could not be loaded ({first[:300]})") from None
    finally:
        if bars:
            datasets.enable_progress_bars()
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    if len(ds) == 0:
        raise DataError(f"dataset '{dataset}': no rows")
    for i, row in enumerate(ds):
        check_row(row, f"dataset '{dataset}' row {i}")
    return ds


def grpo_dataset(ds):
    """Rows -> {prompt, options, answer_idx} (TRL's standard prompt format; the rewards get the other two)."""
    return ds.map(lambda r: {"prompt": prompt_of(r), "options": r["options"], "answer_idx": r["answer_idx"]},
                  remove_columns=ds.column_names)


def sft_dataset(ds):
    """Rows -> {prompt, completion}: the completion is " <letter>. <option text>" (TRL's prompt-completion
    format: the loss is on the completion only)."""
    return ds.map(lambda r: {"prompt": prompt_of(r),
                             "completion": f" {r['answer_idx']}. {r['options'][r['answer_idx']]}"},
                  remove_columns=ds.column_names)
