"""Data: sources → tokenize + pack (`yxanul prepare`) → token shards → `WindowLoader`.

Public API (imported lazily, so `yxanul.config` can import `DataArgs` without torch/datasets)::

    DataArgs                                   yxanul.data.args
    prepare(args, out_dir=None, progress=True) -> Path
    ensure_prepared(args, is_main_process=True, wait=None) -> Path
    load_tokenizer(name_or_path) -> (name, tokenizer); load_prepared_tokenizer(data_dir)
    WindowLoader(data_dir, split, seq_length, micro_batch_size, seed, rank=0, world_size=1, ...)
    eval_batches(data_dir, seq_length, micro_batch_size, max_batches, rank=0, world_size=1)
    write_shard(path, tokens), open_shard(path) -> np.memmap
"""

from importlib import import_module

_WHERE = {
    "DataArgs": "args", "prepare": "prepare", "ensure_prepared": "prepare", "load_tokenizer": "prepare",
    "load_prepared_tokenizer": "prepare", "WindowLoader": "loader", "eval_batches": "loader",
    "write_shard": "shards", "open_shard": "shards",
}
__all__ = ["DataArgs", "WindowLoader", "ensure_prepared", "eval_batches", "load_prepared_tokenizer",
           "load_tokenizer", "open_shard", "prepare", "write_shard"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
