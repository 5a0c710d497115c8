"""A write that fails for lack of space is one line naming where and the bytes needed, exit 2, with the
previous checkpoint intact: for every file of a checkpoint, datasets' cache and `yxanul prepare`.

The small files (config.yaml, trainer_state.json, manifest.json) meet a real ENOSPC from the kernel through
/dev/full (no root needed). The big ones (model.safetensors, whose SafetensorError wraps the OS error;
optimizer.bin, whose torch writer reports it as RuntimeError; a safetensors file of the FP8 state) and
`prepare` need a real full file system: a small tmpfs, so those tests need root (skipped otherwise)."""

import os
import shutil
import subprocess

import pytest
import torch
from _reliability import yx_here

from yxanul.checkpoint import list_checkpoints, save_checkpoint
from yxanul.checkpoint.manifest import verify_checkpoint
from yxanul.errors import UserError

DEV_FULL = os.path.exists("/dev/full") and not os.path.isfile("/dev/full")


def _acc_model():
    from accelerate import Accelerator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters()))
    model(torch.randn(2, 256)).sum().backward()
    opt.step()  # optimizer.bin holds Adam's moments
    return acc


def _state(step):
    return {"step": step, "tokens_seen": step, "val_loss": None, "data": {"epoch": 0, "position": 0}}


def _fp8_like(d):
    from safetensors.torch import save_file

    save_file({"scale": torch.ones(64, 1024)}, str(d / "fp8_state.safetensors"))  # what save_fp8_state writes


def _check_one_line_and_intact(e, run, step: int) -> None:
    root = run / "checkpoints"
    msg = str(e.value)
    assert msg.startswith(f"disk full: saving checkpoint step_{step} into {root} needs about ") and "\n" not in msg
    assert " bytes, " in msg and "step_2 is intact" in msg, msg
    assert not (root / f".tmp-step_{step}").exists() and [c["step"] for c in list_checkpoints(run)] == [2]
    assert verify_checkpoint(root / "step_2") == [] and (root / "latest").read_text().strip() == "step_2"


@pytest.mark.skipif(not DEV_FULL, reason="needs the /dev/full device (Linux)")
@pytest.mark.parametrize("name", ["config.yaml", "trainer_state.json", "manifest.json"])
def test_a_full_disk_at_each_small_checkpoint_file(tmp_path, name):
    acc, run = _acc_model(), tmp_path / "run"
    save_checkpoint(acc, run, _state(2), keep_last=3, config_yaml="a: 1\n")

    def full_at(stage):  # the file (or the atomic write's temporary file) goes to /dev/full: a real ENOSPC
        if stage == "after_state":
            tmp = run / "checkpoints" / ".tmp-step_4"
            target = tmp / (name if name == "config.yaml" else f".{name}.tmp{os.getpid()}")
            target.symlink_to("/dev/full")

    with pytest.raises(UserError) as e:
        save_checkpoint(acc, run, _state(4), keep_last=3, config_yaml="a: 1\n", _fault=full_at)
    _check_one_line_and_intact(e, run, 4)


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of 16 MB (root only), unmounted after the test."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and tmpfs mounts for a real full file system; the small files are tested "
                    "through /dev/full above")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _leave_free(mnt, free: int) -> None:
    """Fill the file system until ``free`` bytes are left."""
    fill = shutil.disk_usage(mnt).free - free
    with open(mnt / "filler", "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(fill, 0))


@pytest.mark.parametrize("fail_in", ["model.safetensors", "optimizer.bin", "fp8_state.safetensors"])
def test_a_full_file_system_at_each_big_checkpoint_file(small_fs, fail_in):
    acc, run = _acc_model(), small_fs / "run"
    save_checkpoint(acc, run, _state(2), keep_last=3, extra=_fp8_like)
    size = {p.name: p.stat().st_size for p in (run / "checkpoints" / "step_2").iterdir()}
    before = {"model.safetensors": 0, "optimizer.bin": size["model.safetensors"],
              "fp8_state.safetensors": sum(v for k, v in size.items() if k != "fp8_state.safetensors")}[fail_in]
    _leave_free(small_fs, before + size[fail_in] // 2)
    with pytest.raises(UserError) as e:
        save_checkpoint(acc, run, _state(4), keep_last=3, extra=_fp8_like)
    _check_one_line_and_intact(e, run, 4)


def _docs(path, n=300):
    import json

    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"document {i} " + "lorem ipsum dolor sit amet " * 200}) + "\n")
    return path


@pytest.mark.parametrize("streaming", [False, True])
def test_prepare_on_a_full_file_system_is_one_line_about_prepare(small_fs, tmp_path, streaming):
    """Not streamed, datasets' Arrow copy fills the disk first (it lives in the work folder); streamed, the
    shards do. Either way: one line naming the folder and bytes, no training flags advised."""
    src = _docs(tmp_path / "docs.jsonl")
    _leave_free(small_fs, 200_000)
    out = small_fs / "d"
    r = yx_here("prepare", "--dataset", src, "--data_dir", out, "--shard_size_tokens", "100000",
                "--prepare_num_proc", "1", *(["--streaming"] if streaming else []))
    line = r.stderr.strip().splitlines()[-1]  # above it: the progress bar only
    assert r.returncode == 2 and "Traceback" not in r.stderr and line.startswith("error: disk full: "), r.stderr
    assert "bytes" in line and " free" in line and "--output_dir" not in line and "--resume" not in line, line
    assert (f"datasets' cache {out}.partial" if not streaming else f"preparing into {out}.partial") in line, line
