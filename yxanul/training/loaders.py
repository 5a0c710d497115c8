"""The trainer's data: the prepared data set (its folder, vocab size and tokenizer), the training
loader of a stage (this rank's packed windows; curriculum stages share one chunk order) and the
fixed validation batches."""

from __future__ import annotations

import json
from pathlib import Path

from ..data.loader import WindowLoader, eval_batches
from ..data.prepare import ensure_prepared, given_prepared
from ..data.tokenizer_load import load_prepared_tokenizer


def prepared_data(cfg, dist, say) -> tuple[str, int, object]:
    """(data_dir, vocab_size, tokenizer) of the prepared data, preparing it first if needed (the local
    main process of each node prepares, the others wait)."""
    data_dir = ensure_prepared(cfg.data, is_main_process=dist.is_local_main_process,
                               wait=dist.wait_for_everyone, say=say)
    meta = json.loads((Path(data_dir) / "meta.json").read_text())
    was, asked = meta.get("val_fraction"), cfg.data.val_fraction
    if given_prepared(cfg.data) and "val_fraction" in cfg.user_keys and was != asked:
        say(f"warning: val_fraction {asked} does not change data_dir '{data_dir}': its split is the one `yxanul "
            f"prepare` made ({f'val_fraction {was}' if was else 'by an older yxanul'}); to change it, prepare it "
            f"again: {_prepare_again(data_dir)}")
    return data_dir, meta["vocab_size"], load_prepared_tokenizer(data_dir)


def _prepare_again(data_dir) -> str:
    """`yxanul prepare` refuses a folder that holds other settings' shards: another one, or this one deleted."""
    return f"`yxanul prepare --dataset ... --val_fraction X` into another --data_dir, or after deleting '{data_dir}'"


def more_val(cfg, data_dir) -> str:
    """How to get a larger validation split, for where the data came from: a folder given alone was split by
    `yxanul prepare` (val_fraction changes nothing there); data prepared here from ``dataset`` takes a larger
    val_fraction, in another folder than a ``data_dir`` that holds this split."""
    if given_prepared(cfg.data):
        return f"prepare the data again with a larger val_fraction ({_prepare_again(data_dir)})"
    if cfg.data.data_dir:
        return f"raise val_fraction (with another data_dir: '{data_dir}' holds this split)"
    return "raise val_fraction"


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
    more = more_val(cfg, data_dir)
    batches = list(eval_batches(data_dir, cfg.model.seq_length, micro, cfg.tracking.eval_steps,
                                rank=accelerator.process_index, world_size=accelerator.num_processes, more_val=more))
    asked, n = cfg.tracking.eval_steps, accelerator.num_processes
    total = len(batches) * n
    if total < asked:
        why = (f"a multiple of the {n} processes" if total == asked // n * n else
               f"the split holds no more (for more: {more})")
        say(f"eval: {total} validation batches of {micro} x {cfg.model.seq_length} tokens, not eval_steps {asked}: "
            f"{why}")
    return batches
