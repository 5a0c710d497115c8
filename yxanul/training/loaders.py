"""The trainer's data: the prepared data set (its folder, vocab size and tokenizer), the training
loader of a stage (this rank's packed windows; curriculum stages share one chunk order) and the
fixed validation batches."""

from __future__ import annotations

import json
from pathlib import Path

from ..data.loader import WindowLoader, eval_batches
from ..data.prepare import ensure_prepared
from ..data.tokenizer_load import load_prepared_tokenizer


def prepared_data(data_args, dist, say) -> tuple[str, int, object]:
    """(data_dir, vocab_size, tokenizer) of the prepared data, preparing it first if needed (the local
    main process of each node prepares, the others wait)."""
    data_dir = ensure_prepared(data_args, is_main_process=dist.is_local_main_process,
                               wait=dist.wait_for_everyone, say=say)
    vocab_size = json.loads((Path(data_dir) / "meta.json").read_text())["vocab_size"]
    return data_dir, vocab_size, load_prepared_tokenizer(data_dir)


def train_loader(data_dir, cfg, seq_length: int, micro: int, accumulation: int, accelerator, curriculum: bool):
    """A `WindowLoader` of one (B, T + 1) shard-dtype tensor per micro-step for this rank, its epochs ending on
    whole optimizer steps of ``accumulation`` micro-steps. Under a curriculum every stage shares the chunk order
    of the base ``seq_length`` (``base_length``)."""
    return WindowLoader(data_dir, "train", seq_length, micro, seed=cfg.train.seed, accumulation=accumulation,
                        base_length=cfg.model.seq_length if curriculum else None,
                        rank=accelerator.process_index, world_size=accelerator.num_processes,
                        num_workers=cfg.data.num_workers, pin_memory=accelerator.device.type == "cuda",
                        packed=True)


def warn_lost_tokens(loader, say) -> None:
    """One line when more than 2 % of the training tokens can't be reached (windows never cross shards)."""
    lost = loader.windows.lost_fraction
    if lost > 0.02:
        say(f"warning: {lost:.0%} of the training tokens are shard tails shorter "
            "than a window (windows never cross shards): prepare with a larger shard_size_tokens")


def val_batches(data_dir, cfg, micro: int, accelerator, say=print) -> list:
    """The share for this rank of the ``eval_steps`` fixed validation batches at the base ``seq_length``; fewer
    than asked (a small split, or eval_steps rounded down to a multiple of the processes) is said once."""
    batches = list(eval_batches(data_dir, cfg.model.seq_length, micro, cfg.tracking.eval_steps,
                                rank=accelerator.process_index, world_size=accelerator.num_processes))
    asked, n = cfg.tracking.eval_steps, accelerator.num_processes
    total = len(batches) * n
    if total < asked:
        why = (f"a multiple of the {n} processes" if total == asked // n * n else
               "the split holds no more (more: a larger val_fraction)")
        say(f"eval: {total} validation batches of {micro} x {cfg.model.seq_length} tokens, not eval_steps {asked}: "
            f"{why}")
    return batches
