"""`yxanul bench-data`: the raw tokenizer vs the whole `yxanul prepare` pipeline, on the same documents.

Measured in one run, on one set of documents (the bundled corpus repeated ``--repeat`` times, or
``--dataset``), each timing the best of ``--trials`` (other processes share the cores):

- raw ``tokenizers.Tokenizer.encode_batch`` (all threads, and one thread) — the tokenizer alone;
- raw tiktoken ``encode_ordinary_batch`` when the tokenizer has an exact tiktoken path;
- the pipeline: `prepare()` end to end (read, tokenize, mix, pack, hash, write shards and meta) with
  1, 2, ... tokenizing processes (``--num_procs``), into a temporary folder.

It prints a Markdown table and two ratios: pipeline / raw tokenizer (on all
cores) and the pipeline's speed-up from 1 to 2 processes.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, DataError
from ..flags import parse_command
from .args import DataArgs
from .sources import BUNDLED_CORPUS, Source, text_values
from .tiktoken_path import build_encoding, tiktoken_spec
from .tokenizer_load import load_tokenizer


@dataclass
class BenchDataCommand:
    """Measure tokenizer and `yxanul prepare` throughput on the same documents (docs/data.md)."""

    dataset: str | None = field(default=None, metadata={"help": "A .jsonl file with a 'text' column (default: the "
                                                                "bundled corpus, repeated --repeat times)."})
    repeat: int = field(default=4, metadata={"help": "Copies of the bundled corpus to measure on (1.5M tokens each)."})
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer name or folder (default: the bundled 8k "
                                                                  "BPE); 'gpt2-offline' for GPT-2's."})
    num_procs: list[int] = field(default_factory=lambda: [1, 2], metadata={"help": "Tokenizing process counts of "
                                                                                    "the pipeline to measure."})
    prepare_backend: str = field(default="tokenizers", metadata={"help": "Pipeline tokenizer: tokenizers, tiktoken or "
                                                                         "auto (as `yxanul prepare`)."})
    trials: int = field(default=2, metadata={"help": "Runs of each measurement; the best is kept."})
    output: str | None = field(default=None, metadata={"help": "Also write the results as JSON here."})

    def __post_init__(self):
        if self.repeat < 1 or self.trials < 1:
            raise ConfigError("repeat/trials", "integers >= 1", (self.repeat, self.trials))
        if not self.num_procs or min(self.num_procs) < 1:
            raise ConfigError("num_procs", "integers >= 1", self.num_procs)
        if self.prepare_backend not in ("tokenizers", "tiktoken", "auto"):
            raise ConfigError("prepare_backend", "one of tokenizers, tiktoken, auto", self.prepare_backend)


def _read_jsonl(path: str) -> list:
    """The 'text' of every line of a .jsonl file; a bad line is one line naming its number."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, ValueError) as e:
        raise DataError(f"dataset '{path}': expected a .jsonl file with a 'text' column ({e})") from None
    docs = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            docs.append(json.loads(line)["text"])
        except (ValueError, KeyError, TypeError) as e:
            what = "no 'text' key" if isinstance(e, (KeyError, TypeError)) else f"not JSON ({e})"
            raise DataError(f"dataset '{path}': line {i}: {what}; expected a .jsonl file with a 'text' column") \
                from None
    return docs


def _documents(args: BenchDataCommand, tmp: Path) -> tuple[Path, list[str]]:
    if args.dataset:
        docs = _read_jsonl(args.dataset)
    else:
        with gzip.open(BUNDLED_CORPUS, "rt", encoding="utf-8") as f:
            docs = [json.loads(line)["text"] for line in f] * args.repeat
    docs = text_values(docs, Source(args.dataset, None, None), "convert them")  # as prepare reads them
    if not any(d.strip() for d in docs):
        raise DataError(f"dataset '{args.dataset}': contains no text")
    path = tmp / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs))
    return path, docs


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _raw_measurements(tok, docs: list[str]) -> dict:
    """name -> a function running the raw tokenizer over ``docs`` in the pipeline's batches."""
    from .mixture import BATCH_DOCS  # numpy: --help stays light

    raw = tok.backend_tokenizer
    batches = [docs[i:i + BATCH_DOCS] for i in range(0, len(docs), BATCH_DOCS)]

    def hf(parallel: str):
        def run():
            os.environ["TOKENIZERS_PARALLELISM"] = parallel
            [raw.encode_batch(b, add_special_tokens=False) for b in batches]
            os.environ.pop("TOKENIZERS_PARALLELISM")
        return run
    out = {"raw tokenizers encode_batch (all threads)": hf("true"),
           "raw tokenizers encode_batch (1 thread)": hf("false")}
    spec = tiktoken_spec(tok)
    if spec:
        enc = build_encoding(spec)
        for n in (os.cpu_count() or 1, 1):
            out[f"raw tiktoken encode_ordinary_batch ({n} threads)"] = \
                lambda n=n: [enc.encode_ordinary_batch(b, num_threads=n) for b in batches]
    return out


def _pipeline(args: BenchDataCommand, path: Path, tmp: Path, procs: int, trial: int) -> tuple[float, float]:
    """(end-to-end seconds, packing-phase seconds) of one `prepare()`."""
    from . import tokenize  # numpy: --help stays light
    from .prepare import prepare, read_meta  # numpy: --help stays light

    lazy, tokenize.LAZY_CHARS = tokenize.LAZY_CHARS, 0  # workers from the first batch, as on a real corpus
    out = tmp / f"p{procs}-{trial}"
    try:
        dt = _timed(lambda: prepare(DataArgs(dataset=str(path), tokenizer=args.tokenizer, data_dir=str(out),
                                             prepare_num_proc=procs, prepare_backend=args.prepare_backend,
                                             shard_size_tokens=10_000_000), progress=False, say=lambda *a, **k: None))
    finally:
        tokenize.LAZY_CHARS = lazy
    meta = read_meta(out)
    return dt, meta["stats"]["pack_seconds"], sum(s["tokens"] for s in meta["splits"].values())


def run(args: BenchDataCommand, say=print) -> dict:

    with tempfile.TemporaryDirectory(prefix="yxanul-bench-data-") as d:
        tmp = Path(d)
        path, docs = _documents(args, tmp)
        _, tok = load_tokenizer(args.tokenizer)
        tokens = sum(len(x) + 1 for x in tok(docs, add_special_tokens=False,
                                             split_special_tokens=True)["input_ids"] if x)
        raw = _raw_measurements(tok, docs)
        best: dict[str, float] = {}
        for trial in range(args.trials):  # interleaved: a load change on the machine hits every measurement
            for name, fn in raw.items():
                best[name] = min(best.get(name, 1e9), _timed(fn))
            for p in args.num_procs:
                e2e, pack, n = _pipeline(args, path, tmp, p, trial)
                if n != tokens:  # the pipeline must have tokenized exactly what the raw tokenizer did
                    raise RuntimeError(f"bench-data: the pipeline wrote {n:,} tokens, the raw tokenizer {tokens:,}")
                for name, dt in ((f"pipeline: packing phase, {p} process(es)", pack),
                                 (f"pipeline: yxanul prepare end to end, {p} process(es)", e2e)):
                    best[name] = min(best.get(name, 1e9), dt)
    rows = [{"what": k, "seconds": v, "tokens_per_s": tokens / v} for k, v in best.items()]
    # the pipeline against the raw tokenizer it runs (tiktoken when the pipeline used it), all threads
    tik = [k for k in best if k.startswith("raw tiktoken") and not k.endswith("(1 threads)")]
    raw_name = tik[0] if tik and args.prepare_backend != "tokenizers" else "raw tokenizers encode_batch (all threads)"
    raw_all = tokens / best[raw_name]
    pipe = {p: tokens / best[f"pipeline: packing phase, {p} process(es)"] for p in args.num_procs}
    result = {"documents": len(docs), "tokens": tokens, "cpu_count": os.cpu_count(), "rows": rows, "raw": raw_name,
              "pipeline_over_raw": max(pipe.values()) / raw_all,
              "scaling_1_to_2": pipe[2] / pipe[1] if 1 in pipe and 2 in pipe else None}
    say(f"| measurement ({len(docs):,} documents, {tokens:,} tokens, {os.cpu_count()} cores) | seconds | tokens/s |")
    say("|---|---|---|")
    for r in rows:
        say(f"| {r['what']} | {r['seconds']:.2f} | {r['tokens_per_s']:,.0f} |")
    say(f"pipeline packing phase (best) / {raw_name}: {100 * result['pipeline_over_raw']:.0f} %"
        + (f"; pipeline 1 -> 2 processes: {result['scaling_1_to_2']:.2f}x" if result["scaling_1_to_2"] else ""))
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_command(BenchDataCommand, argv, prog="yxanul bench-data")
    if args.output:  # before minutes of measuring, not after
        parent = Path(args.output).expanduser().absolute().parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) or Path(args.output).is_dir():
            raise ConfigError("output", f"a file in an existing, writable folder ('{parent}')", args.output)
    result = run(args)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
    return 0
