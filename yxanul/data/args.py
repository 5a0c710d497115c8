"""`DataArgs`: where the text comes from, how it is tokenized and where the shards live."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError


@dataclass
class DataArgs:
    """Dataset, tokenizer and loader."""

    dataset: str | None = field(
        default=None, metadata={"help": "Text source: a file, glob or directory (.txt/.md/.jsonl/.json/.parquet/.csv, "
                                        ".gz ok) or a Hub dataset name. Default: the bundled Shakespeare corpus."})
    datasets: list[dict] | None = field(
        default=None, metadata={"help": "YAML only: a weighted mixture, [{path, weight, split, text_column, name}]."})
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset config name (e.g. sample-10BT)."})
    dataset_split: str = field(default="train", metadata={"help": "Split of the source to read."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text (jsonl/parquet/Hub)."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "HF tokenizer name or folder. Default: the bundled 8k BPE trained on the corpus."})
    data_dir: str | None = field(
        default=None, metadata={"help": "Folder of prepared token shards (default: $YXANUL_CACHE/data/<fingerprint>, "
                                        "$YXANUL_CACHE defaulting to ~/.cache/yxanul)."})
    val_fraction: float = field(default=0.01, metadata={"help": "Fraction of documents held out for validation."})
    streaming: bool = field(default=False, metadata={"help": "Stream the source while preparing (large Hub datasets)."})
    max_documents: int | None = field(default=None, metadata={"help": "Stop preparing after this many documents (streamed sources)."})
    num_workers: int = field(default=1, metadata={"help": "DataLoader worker processes feeding training batches."})
    prepare_num_proc: int | None = field(default=None, metadata={"help": "Processes for tokenizing (default: CPU count, max 8)."})
    shard_size_tokens: int = field(default=100_000_000, metadata={"help": "Tokens per shard file."})

    def __post_init__(self):
        if self.dataset is not None and self.datasets is not None:
            raise ConfigError("datasets", "either 'dataset' or 'datasets', not both", "both set")
        if self.datasets is not None:
            if not self.datasets or not all(isinstance(d, dict) and "path" in d for d in self.datasets):
                raise ConfigError("datasets", "a non-empty list of mappings with a 'path' (and optional weight, "
                                  "split, text_column, name)", self.datasets)
            for d in self.datasets:
                unknown = set(d) - {"path", "weight", "split", "text_column", "name"}
                if unknown:
                    raise ConfigError("datasets", "entries with keys path, weight, split, text_column, name",
                                      sorted(unknown))
                if float(d.get("weight", 1.0)) <= 0:
                    raise ConfigError("datasets", "positive weights", d.get("weight"))
        if not 0.0 < self.val_fraction < 0.5:
            raise ConfigError("val_fraction", "a number in (0, 0.5)", self.val_fraction)
        if self.num_workers < 0:
            raise ConfigError("num_workers", "an integer >= 0", self.num_workers)
        if self.shard_size_tokens < 1024:
            raise ConfigError("shard_size_tokens", "an integer >= 1024", self.shard_size_tokens)
