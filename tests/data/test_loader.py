"""WindowLoader: shapes, determinism, exact resume (workers or not), world-size change, epochs; eval batches."""

import json

import numpy as np
import pytest
import torch

from yxanul.data.args import DataArgs
from yxanul.data.loader import WindowLoader, eval_batches
from yxanul.data.prepare import prepare
from yxanul.data.shards import open_shard
from yxanul.errors import DataError

Q = {"progress": False, "say": lambda *a, **k: None}


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b, strict=False))


def test_windows_are_shifted_slices_of_the_shards(bundled):
    meta = json.loads((bundled / "meta.json").read_text())
    flat = np.concatenate([open_shard(bundled / f) for f in meta["splits"]["train"]["shards"]]).astype(np.int64)
    x, y = take(WindowLoader(bundled, "train", 64, 4, seed=1), 1)[0]
    assert x.shape == y.shape == (4, 64) and x.dtype == y.dtype == torch.long and torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x.numpy(), y.numpy(), strict=True):
        start = int(np.flatnonzero(np.all(
            np.lib.stride_tricks.sliding_window_view(flat, 64)[::64] == row_x, 1))[0]) * 64
        assert np.array_equal(flat[start + 1:start + 65], row_y)  # a window on the stride-seq_length grid


def test_determinism_and_seeds(bundled):
    a = take(WindowLoader(bundled, "train", 64, 4, seed=1), 3)
    assert same(a, take(WindowLoader(bundled, "train", 64, 4, seed=1, num_workers=2), 3))
    assert not torch.equal(a[0][0], take(WindowLoader(bundled, "train", 64, 4, seed=2), 1)[0][0])


def test_iterating_leaves_the_global_torch_rng_alone(bundled):
    """Each DataLoader iterator draws a base seed; from the loader's own generator, not the training's torch RNG,
    which a resume restores and the loader would otherwise move once per epoch and per resume."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    loader = WindowLoader(bundled, "train", 64, 4, seed=1)
    take(loader, 2), take(loader, 1)  # two iterators
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume(bundled, workers):
    ref = take(WindowLoader(bundled, "train", 64, 4, seed=3), 8)
    first = WindowLoader(bundled, "train", 64, 4, seed=3, num_workers=workers)
    assert same(take(first, 5), ref[:5])
    state = first.state_dict()  # counts what was handed out, not what workers prefetched
    assert state == {"epoch": 0, "position": 20, "seq_length": 64, "seed": 3, "base_length": 64,
                     "micro_batch_size": 4, "world_size": 1}
    second = WindowLoader(bundled, "train", 64, 4, seed=3, num_workers=workers)
    second.load_state_dict(json.loads(json.dumps(state)))
    assert same(take(second, 3), ref[5:])
    assert same(take(first, 3), ref[5:])  # a new iter() of the same loader continues too


def test_world_size_change(bundled):
    one = take(WindowLoader(bundled, "train", 64, 4, seed=5), 3)
    r0 = take(WindowLoader(bundled, "train", 64, 2, seed=5, rank=0, world_size=2), 3)
    r1 = take(WindowLoader(bundled, "train", 64, 2, seed=5, rank=1, world_size=2), 3)
    for k in range(3):  # 2 ranks x 2 = 1 rank x 4 at the same global positions
        assert torch.equal(one[k][0], torch.cat([r0[k][0], r1[k][0]]))
    two = WindowLoader(bundled, "train", 64, 2, seed=5, rank=1, world_size=2)
    take(two, 1)
    solo = WindowLoader(bundled, "train", 64, 4, seed=5)
    solo.load_state_dict(two.state_dict())
    assert solo.state_dict()["position"] == 4 and same(take(solo, 2), one[1:])
    four = [WindowLoader(bundled, "train", 64, 1, seed=5, rank=r, world_size=4) for r in range(4)]
    for ld in four:
        ld.load_state_dict(two.state_dict())
    assert torch.equal(torch.cat([take(ld, 1)[0][0] for ld in four]), one[1][0])


def test_epoch_wraparound_new_permutation(tmp_path, docs_file):
    path, _ = docs_file(30)
    out = prepare(DataArgs(dataset=str(path), val_fraction=0.1), **Q)
    loader = WindowLoader(out, "train", 8, 2, seed=0)
    steps = loader._ds.steps_per_epoch
    batches = take(loader, 2 * steps + 1)
    assert loader.epoch == 2 and loader.state_dict()["position"] == 2
    epoch0, epoch1 = (torch.cat([b[0] for b in batches[i * steps:(i + 1) * steps]]) for i in (0, 1))
    assert not torch.equal(epoch0, epoch1)  # another order ...
    rows = sorted(map(tuple, epoch0.tolist()))
    assert rows == sorted(map(tuple, epoch1.tolist()))  # ... of the same windows
    resumed = WindowLoader(out, "train", 8, 2, seed=0)
    resumed.load_state_dict({"epoch": 1, "position": 2 * (steps - 1), "seq_length": 8, "seed": 0})
    assert same(take(resumed, 2), batches[2 * steps - 1:2 * steps + 1])  # resume across the wrap
    ends = WindowLoader(out, "train", 8, 2, seed=0)
    take(ends, steps)  # epoch 0's last batch: `epoch` is the next one's, `last_epoch` the one handed out
    assert (ends.last_epoch, ends.epoch, ends.state_dict()["epoch"]) == (0, 1, 1)
    take(ends, 1)
    assert ends.last_epoch == ends.epoch == 1


def test_one_process_accumulating_and_that_many_processes_read_the_same_windows_across_epochs(tmp_path, docs_file):
    """Epochs end on whole optimizer steps: 1 process x accumulation 2 and 2 processes x 1 get the same windows
    in every optimizer step, also where the split does not divide into steps (a step straddled the boundary)."""
    path, _ = docs_file(30)
    out = prepare(DataArgs(dataset=str(path), val_fraction=0.1), **Q)
    one = WindowLoader(out, "train", 8, 2, seed=0, accumulation=2)
    r0, r1 = (WindowLoader(out, "train", 8, 2, seed=0, rank=r, world_size=2) for r in (0, 1))
    n = one.windows.n
    assert n % 4, n  # windows left over at each epoch's end: the case that parted the two orders
    steps = 3 * (n // 4)  # three epochs of optimizer steps
    a, b0, b1 = take(one, 2 * steps), take(r0, steps), take(r1, steps)
    for s in range(steps):
        assert torch.equal(torch.cat([a[2 * s][0], a[2 * s + 1][0]]), torch.cat([b0[s][0], b1[s][0]])), s
    assert one.epoch == r0.epoch == 3 and one.state_dict()["position"] == r0.state_dict()["position"] == 0


def test_eval_batches_fixed_and_errors(bundled, tmp_path, docs_file):
    a, b = list(eval_batches(bundled, 64, 4, 3)), list(eval_batches(bundled, 64, 4, 3))
    assert len(a) == 3 and same(a, b) and a[0][0].shape == (4, 64)
    # eval_steps counts the batches of all processes: 2 processes split the 4 one process evaluates (val_loss
    # independent of the world size); 3 rounds down to 2, one each
    four = list(eval_batches(bundled, 64, 4, 4))
    r0, r1 = list(eval_batches(bundled, 64, 4, 4, rank=0, world_size=2)), list(eval_batches(bundled, 64, 4, 4, 1, 2))
    assert same(four[:3], a) and same(r0, four[0::2]) and same(r1, four[1::2])
    assert len(list(eval_batches(bundled, 64, 4, 3, rank=1, world_size=2))) == 1
    assert len(list(eval_batches(bundled, 64, 4, 1, rank=1, world_size=4))) == 1  # at least one each
    val_tokens = json.loads((bundled / "meta.json").read_text())["splits"]["val"]["tokens"]
    with pytest.raises(DataError, match=f"validation split has {val_tokens:,} tokens; need at least seq_length\\+1 = "
                                        "60001: lower seq_length or prepare the data again with a larger "
                                        "val_fraction$"):
        list(eval_batches(bundled, 60_000, 1, 1))
    path, _ = docs_file(30)
    out = prepare(DataArgs(dataset=str(path), val_fraction=0.1), **Q)
    with pytest.raises(DataError, match="one step needs micro_batch_size x world_size"):
        WindowLoader(out, "train", 8, 64, seed=0, world_size=8)


def test_order_is_the_documented_permutation(bundled):
    loader = WindowLoader(bundled, "train", 64, 4, seed=7)
    n = loader.windows.n
    perm = np.random.default_rng([7, 0]).permutation(n)  # the documented pure function of (seed, epoch)
    x, _ = take(loader, 1)[0]
    assert torch.equal(x, torch.from_numpy(loader.windows.gather(perm[:4]))[:, :-1])


def test_resume_with_workers_across_the_epoch_wrap(tmp_path, docs_file):
    path, _ = docs_file(40)
    out = prepare(DataArgs(dataset=str(path), val_fraction=0.1), **Q)
    ref = WindowLoader(out, "train", 8, 2, seed=4)
    steps = ref._ds.steps_per_epoch
    want = take(ref, steps + 3)
    first = WindowLoader(out, "train", 8, 2, seed=4, num_workers=2)
    assert same(take(first, steps - 1), want[:steps - 1])
    state = first.state_dict()
    assert state["epoch"] == 0 and state["position"] == 2 * (steps - 1)
    second = WindowLoader(out, "train", 8, 2, seed=4, num_workers=2)
    second.load_state_dict(state)
    assert same(take(second, 4), want[steps - 1:steps + 3]) and second.epoch == 1


def test_val_split_loader_too_small_names_the_split(tmp_path, docs_file):
    path, _ = docs_file(30)
    out = prepare(DataArgs(dataset=str(path), val_fraction=0.1), **Q)
    with pytest.raises(DataError, match="^val split has .* one step needs micro_batch_size x world_size"):
        WindowLoader(out, "val", 8, 64, seed=0)
    with pytest.raises(DataError, match="no 'test' split"):
        WindowLoader(out, "test", 8, 1, seed=0)


def test_curriculum_stages_share_one_pass_without_repeats(bundled):
    """Stage 0 reads 64-token sub-windows of 256-token chunks, stage 1 whole chunks: over one epoch
    no 64-token segment is trained twice and at most one chunk is skipped at the stage change."""
    meta = json.loads((bundled / "meta.json").read_text())
    assert len(meta["splits"]["train"]["shards"]) == 1
    flat = open_shard(bundled / meta["splits"]["train"]["shards"][0]).astype(np.int64)
    where = {}
    for p in range(0, len(flat) - 64, 64):
        where.setdefault(flat[p:p + 64].tobytes(), []).append(p // 64)
    seen = []

    def segments(x, per):  # the 64-token segments a batch covers
        for row in x.numpy():
            first = where[row[:64].tobytes()]
            assert len(first) == 1  # unambiguous in this corpus
            seen.extend(range(first[0], first[0] + per))

    stage0 = WindowLoader(bundled, "train", 64, 4, seed=5, base_length=256)
    it = iter(stage0)
    for _ in range(301):  # 1204 sub-windows: 301 chunks, the last one only partly read
        segments(next(it)[0], 1)
    stage1 = WindowLoader(bundled, "train", 256, 2, seed=5, base_length=256)
    stage1.load_state_dict(stage0.state_dict())
    assert stage1.state_dict()["position"] == 301 and stage1.epoch == 0  # the next whole chunk, same epoch
    for x, _ in stage1:
        if stage1.epoch:
            break
        segments(x, 4)
    assert len(seen) == len(set(seen))  # no token trained twice within the pass
    n_chunks = stage1.windows.n_chunks
    assert len(seen) >= 4 * (n_chunks - 1) - 4 * 2  # all but the partly read chunk (and a partial last step)


def test_small_shards_warn_by_their_loss_and_fail_naming_shard_size_tokens(tmp_path):
    out = prepare(DataArgs(data_dir=str(tmp_path / "d"), shard_size_tokens=1024), **Q)  # the bundled corpus
    assert 0.06 < WindowLoader(out, "train", 64, 4, seed=0).windows.lost_fraction < 0.07  # 15 of 16 windows
    assert 0.2 < WindowLoader(out, "train", 256, 4, seed=0).windows.lost_fraction < 0.3  # 3 windows of 1024 tokens
    with pytest.raises(DataError,
                       match="at most 1,024 tokens each, too few for one window of 1025: .*shard_size_tokens"):
        WindowLoader(out, "train", 1024, 1, seed=0)


def test_packed_batches_are_the_same_tokens_in_the_shard_dtype(bundled):
    from yxanul.data.loader import split_window

    plain = take(WindowLoader(bundled, "train", 64, 4, seed=7), 3)
    packed = take(WindowLoader(bundled, "train", 64, 4, seed=7, packed=True, num_workers=1), 3)
    for (x, y), win in zip(plain, packed, strict=True):
        assert win.shape == (4, 65) and win.dtype in (torch.uint16, torch.uint32)
        px, py = split_window(win, torch.device("cpu"))
        assert px.dtype == torch.long and torch.equal(px, x) and torch.equal(py, y)
    ev = next(eval_batches(bundled, 64, 4, 1, packed=True))
    assert torch.equal(split_window(ev, "cpu")[0], next(eval_batches(bundled, 64, 4, 1))[0])


_HANG = """
import sys
from yxanul.data.loader import WindowLoader
it = iter(WindowLoader(sys.argv[1], "train", 64, 4, seed=0, num_workers=2))
next(it)
print("WORKERS", flush=True)
raise RuntimeError("boom mid-iteration")  # uncaught: the traceback keeps the iterator alive at exit
"""


def test_an_uncaught_error_with_workers_exits_instead_of_hanging(bundled):
    """Workers ignore SIGTERM (preemption) and multiprocessing's exit handler joins them with no
    timeout after a SIGTERM: the process hung until SIGKILL (issue 17). Now it exits in seconds."""
    import subprocess
    import sys
    import time

    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", _HANG, str(bundled)], capture_output=True, text=True, timeout=90)
    assert "WORKERS" in r.stdout and "boom mid-iteration" in r.stderr and r.returncode == 1
    assert time.time() - t0 < 60


def test_closing_the_iteration_stops_its_workers(bundled):
    it = iter(WindowLoader(bundled, "train", 64, 4, seed=0, num_workers=2))
    next(it)
    workers = list(it.gi_frame.f_locals["it"]._workers)
    assert workers and all(w.is_alive() for w in workers)
    it.close()
    assert not any(w.is_alive() for w in workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_id_outside_the_vocabulary_is_one_line_naming_shard_and_token(bundled, tmp_path, workers):
    """A shard edited after it verified (verify.py trusts an unchanged size/times/inode): the batch that reads the
    bad id is a DataError naming the shard and the token, not an IndexError in the embedding; from a worker too
    (torch would put the worker's traceback in the message)."""
    import re
    import shutil

    data = tmp_path / "d"
    shutil.copytree(bundled, data)
    for split in ("train", "val"):
        tokens = np.memmap(data / f"{split}_00000.bin", dtype=np.uint16, mode="r+", offset=32)
        tokens[::50] = 9000  # vocabulary 8192; every window of 65 holds one
        tokens.flush()
    with pytest.raises(DataError) as e:
        take(WindowLoader(data, "train", 64, 4, seed=0, num_workers=workers, packed=True), 1)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"shard '{data / 'train_00000.bin'}': token ")
    assert msg.endswith("is id 9000, outside the vocabulary of 8192 (the file changed after it verified); delete "
                        f"{data} and prepare again")
    index = int(re.search(r"token ([\d,]+) is", msg)[1].replace(",", ""))
    assert index % 50 == 0 and open_shard(data / "train_00000.bin")[index] == 9000
    with pytest.raises(DataError, match=f"^shard '{data / 'val_00000.bin'}': token 0 is id 9000"):
        list(eval_batches(data, 64, 4, 1))
