"""Prepared shards as a torch / `datasets` Dataset for Trainer: the loader's windows, in the loader's order."""

import pytest
import torch

from yxanul.data.hf_dataset import ShardWindowDataset, to_hf_dataset
from yxanul.data.loader import WindowLoader
from yxanul.errors import ConfigError, DataError

T, B = 32, 4


@pytest.mark.parametrize("world", [1, 2])
def test_items_are_the_window_loaders_batches_in_its_order(small_data, world):
    """Sequential batches of B items (process r taking batch r of every `world`, as accelerate shards a
    sequential sampler) are exactly WindowLoader's batches for (seed, rank, world), across an epoch end."""
    data_dir, _ = small_data
    ds = ShardWindowDataset(data_dir, T, seed=7, epochs=2)
    n = ds.windows_per_epoch
    steps = n // (B * world)
    for rank in range(world):
        loader = WindowLoader(data_dir, "train", T, B, seed=7, rank=rank, world_size=world)
        it = iter(loader)
        for step in list(range(3)) + [steps - 1]:  # start and the last full step of epoch 0
            while loader._yielded <= step - 1:
                next(it)
            x, y = next(it)                                                   # (B, T) each
            first = (step * world + rank) * B
            items = [ds[i] for i in range(first, first + B)]
            assert torch.equal(x, torch.stack([it_["input_ids"] for it_ in items]))
            assert torch.equal(y, torch.stack([it_["shift_labels"] for it_ in items]))
    # epoch 1 is the loader's epoch-1 permutation, not a repeat of epoch 0
    loader = WindowLoader(data_dir, "train", T, B, seed=7)
    loader.load_state_dict({"epoch": 1, "position": 0, "seq_length": T, "seed": 7})
    x, _ = next(iter(loader))
    assert torch.equal(x, torch.stack([ds[n + i]["input_ids"] for i in range(B)]))
    assert not torch.equal(x, torch.stack([ds[i]["input_ids"] for i in range(B)]))
    assert len(ds) == 2 * n


@pytest.mark.parametrize("world,accumulation", [(1, 1), (2, 3), (2, 5)])  # (2, 5): n % 20 >= B x 5
def test_epochs_are_laid_out_as_the_loader_lays_them_out_for_the_run_batch(small_data, world, accumulation):
    """Over 3 epochs of a split that no global batch divides: the loader drops each epoch's last
    n % (B x W x A) windows and starts the next at window 0; the dataset given the same batch does the same."""
    data_dir, _ = small_data
    ds = ShardWindowDataset(data_dir, T, seed=5, epochs=3, micro_batch_size=B, world_size=world,
                            accumulation=accumulation)
    n, unit = ds.windows.n, B * world * accumulation
    assert n % unit and ds.windows_per_epoch == n // unit * unit and len(ds) == 3 * ds.windows_per_epoch
    steps = len(ds) // (B * world)  # micro-steps of 3 epochs
    for rank in range(world):
        loader = WindowLoader(data_dir, "train", T, B, seed=5, rank=rank, world_size=world, accumulation=accumulation)
        for step, (x, y) in zip(range(steps), loader):
            first = (step * world + rank) * B
            items = [ds[i] for i in range(first, first + B)]
            assert torch.equal(x, torch.stack([it_["input_ids"] for it_ in items])), (rank, step)
            assert torch.equal(y, torch.stack([it_["shift_labels"] for it_ in items])), (rank, step)
        assert loader.epoch == 3  # every batch of epochs 0, 1 and 2 was compared
    with pytest.raises(ConfigError, match="accumulation"):
        ShardWindowDataset(data_dir, T, accumulation=0)


def test_hf_labels_targets_and_datasets_dataset(small_data):
    data_dir, _ = small_data
    plain = ShardWindowDataset(data_dir, T, seed=3)
    hf_style = ShardWindowDataset(data_dir, T, seed=3, targets="labels")
    a, b = plain[5], hf_style[5]
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(b["labels"], b["input_ids"])
    assert torch.equal(a["shift_labels"][:-1], a["input_ids"][1:])  # next-token targets
    hf = to_hf_dataset(data_dir, T, split="val", seed=None)
    val = ShardWindowDataset(data_dir, T, split="val", seed=None)
    assert len(hf) == len(val) and hf.column_names == ["input_ids", "shift_labels"]
    for i in (0, len(val) - 1):
        assert torch.equal(hf[i]["input_ids"], val[i]["input_ids"])
        assert torch.equal(hf[i]["shift_labels"], val[i]["shift_labels"])


def test_bad_input_is_one_line(small_data, tmp_path):
    data_dir, _ = small_data
    with pytest.raises(ConfigError, match="targets"):
        ShardWindowDataset(data_dir, T, targets="y")
    with pytest.raises(ConfigError, match="seq_length"):
        ShardWindowDataset(data_dir, 1)
    with pytest.raises(DataError, match="no meta.json"):
        ShardWindowDataset(tmp_path, T)
    with pytest.raises(IndexError):
        ShardWindowDataset(data_dir, T)[10**9]
