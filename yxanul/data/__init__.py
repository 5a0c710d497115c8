"""Data: sources → tokenize + pack (`yxanul prepare`) → token shards → `WindowLoader`.

Public API (imported lazily, so `yxanul.config` can import `DataArgs` without torch/datasets)::

    DataArgs                                   yxanul.data.args
    prepare(args, out_dir=None, progress=True) -> Path   (parallel, resumable; see prepare.py)
    ensure_prepared(args, is_main_process=True, wait=None) -> Path
    load_tokenizer(name_or_path) -> (name, tokenizer); load_prepared_tokenizer(data_dir)
    WindowLoader(data_dir, split, seq_length, micro_batch_size, seed, rank=0, world_size=1, ...)
    eval_batches(data_dir, seq_length, micro_batch_size, max_batches, rank=0, world_size=1)
    write_shard(path, tokens), open_shard(path) -> np.memmap; ShardWriter (fixed-size shards + manifest)
    Mixture, SourceStream                      yxanul.data.mixture (exact mixing by tokens/documents)
    train_bpe(texts, vocab_size, special_tokens) yxanul.data.tokenizer_train (`yxanul tokenizer train`)
    `yxanul bench-data`                        yxanul.data.bench_data (raw tokenizer vs pipeline)
"""

from .._lazy import lazy_exports

_WHERE = {
    "DataArgs": "args", "prepare": "prepare", "ensure_prepared": "prepare", "load_tokenizer": "tokenizer_load",
    "load_prepared_tokenizer": "tokenizer_load", "WindowLoader": "loader", "eval_batches": "loader",
    "write_shard": "shards", "open_shard": "shards", "ShardWriter": "shards",
    "Mixture": "mixture", "SourceStream": "mixture", "train_bpe": "tokenizer_train",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
