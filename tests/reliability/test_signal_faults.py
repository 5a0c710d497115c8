"""Ctrl-C (SIGINT) and a hangup (SIGHUP) save a checkpoint like SIGTERM, also when they reach the whole
process group (DataLoader workers included); a second Ctrl-C exits at once. Smaller environments: a
read-only output dir and an export OUT that is a file are one line, exit 2; a clock that stands still or
jumps back changes no result and gives no negative duration."""

import os
import signal
import subprocess
import time

import pytest
from _reliability import EXIT_BOUND_S, kill_group, one_line, popen, yx_here
from tiny_run import FAST

from yxanul.checkpoint.manifest import verify_checkpoint

LONG = [*FAST, "--max_steps", "100000", "--checkpoint_freq", "0", "--num_workers", "2"]


def _started(out):
    p = popen("train", *LONG, "--output_dir", str(out), start_new_session=True)
    deadline = time.time() + 240
    for line in p.stdout:
        if line.startswith("step "):
            return p
        assert time.time() < deadline, "no step line"
    raise AssertionError(f"ended before a step: {p.stderr.read()[-2000:]}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_ctrl_c_and_hangup_save_a_checkpoint_like_sigterm(tmp_path, sig):
    out = tmp_path / "r"
    p = _started(out)
    try:
        os.killpg(p.pid, sig)  # what a terminal does: the whole foreground group, workers included
        stdout, stderr = p.communicate(timeout=EXIT_BOUND_S)
    finally:
        kill_group(p)
    assert p.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert f"received {sig.name}: checkpoint saved at step " in stdout
    (ckpt,) = (out / "checkpoints").glob("step_*")
    assert verify_checkpoint(ckpt) == []


def test_a_stop_signal_just_after_the_run_ended_exits_0_without_a_hang(tmp_path):
    """SIGTERM as the scheduler's job ends, right after `done:` (the run's files are written). Before, the
    pre-training handler came back once the loop's was gone: raised inside the DataLoader workers' shutdown it left
    a queue's lock taken (traceback, then a hang); a little later Python's exit had restored the default (killed,
    143). Both moments: exit 0, no traceback, the checkpoint whole."""
    for delay in (0.0, 0.3):
        out = tmp_path / f"r{delay}"
        p = popen("train", *FAST, "--max_steps", "3", "--num_workers", "2", "--output_dir", str(out),
                  start_new_session=True)
        try:
            for line in p.stdout:
                if line.startswith("done: "):
                    time.sleep(delay)
                    assert p.poll() is None, "the process ended before the signal: nothing tested"
                    p.send_signal(signal.SIGTERM)
                    break
            stdout, stderr = p.communicate(timeout=EXIT_BOUND_S)
        finally:
            kill_group(p)
        assert p.returncode == 0 and "Traceback" not in stderr, (delay, p.returncode, stderr[-3000:])
        assert verify_checkpoint(out / "checkpoints" / "step_3") == []


def test_a_second_ctrl_c_exits_at_once():
    """In this process (two signals sent at once to another process coalesce into one): the first Ctrl-C
    asks for the checkpoint, the second raises KeyboardInterrupt (the CLI's `interrupted`, exit 130)."""
    from yxanul.training.preemption import StopRequest

    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler runs between bytecodes of the main thread
        assert stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
    # a Ctrl-C after a SIGTERM (the scheduler's stop, then the user's key) is the first Ctrl-C: the save goes on
    with StopRequest() as stop:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        except KeyboardInterrupt:
            pytest.fail("a Ctrl-C after a SIGTERM exited at once, without the checkpoint")
        assert stop.signum == signal.SIGINT


def test_a_read_only_output_dir_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes through permissions: a read-only file system instead
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]).returncode != 0:
            pytest.skip("root without mount: cannot make a read-only folder")
    else:
        ro.chmod(0o555)
    try:
        r = yx_here("train", *FAST, "--max_steps", "2", "--output_dir", ro / "run")
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True) if os.geteuid() == 0 else ro.chmod(0o755)
    one_line(r, 2, f"error: '{ro / 'run'}': ")
    assert "choose another folder" in r.stderr


def test_a_file_where_the_run_needs_a_folder_and_the_reverse_are_one_line(tmp_path):
    """The trackers' and logs' paths inside the run directory: a file named `tensorboard` (found after step 1,
    when TensorBoard starts) or a folder named `metrics.jsonl`: one line naming it, exit 2."""
    for name, make in (("tensorboard", lambda p: p.write_text("x")), ("metrics.jsonl", lambda p: p.mkdir())):
        run = tmp_path / name.replace(".", "_")
        run.mkdir()
        make(run / name)
        r = yx_here("train", *FAST, "--max_steps", "2", "--use_tensorboard", "true", "--output_dir", run)
        one_line(r, 2, "error: '")
        assert str(run / name) in r.stderr and "is in the way" in r.stderr, r.stderr


def test_a_link_to_an_unmounted_folder_and_a_file_in_an_out_path_are_one_line(tmp_path):
    """A scratch link whose filesystem is not mounted (mkdir: EEXIST on the link) in --output_dir, and a file
    where a plot's folder goes (EEXIST, not ENOTDIR, from Path.mkdir): one line naming it, exit 2."""
    (tmp_path / "scratch").symlink_to(tmp_path / "not-mounted" / "scratch")
    r = yx_here("train", *FAST, "--max_steps", "2", "--output_dir", tmp_path / "scratch" / "run")
    one_line(r, 2, f"error: '{tmp_path / 'scratch'}' is a symbolic link to '{tmp_path / 'not-mounted' / 'scratch'}', "
                   "which does not exist")
    (tmp_path / "file").write_text("mine")
    r = yx_here("plot-lr", "--out", tmp_path / "file" / "lr.png")
    one_line(r, 2, f"error: '{tmp_path / 'file'}': ")
    assert "a file is in the way of a folder" in r.stderr and (tmp_path / "file").read_text() == "mine"


def test_an_export_out_that_is_a_file_is_one_line(base_run, tmp_path):
    f = tmp_path / "file"
    f.write_text("mine")
    for out in (f, f / "sub"):
        one_line(yx_here("export", base_run, out), 2, f"export OUT '{out}': '{f}' is a file, not a folder")
    assert f.read_text() == "mine"


class _Clock:
    """A callback that changes the process's clocks once training begins (what a frozen or stepped clock
    does to the loop: NTP, a VM restored, faketime)."""

    def __init__(self, monkeypatch, what: str):
        self.monkeypatch, self.what = monkeypatch, what

    def on_train_begin(self, trainer):
        if self.what == "frozen":
            self.monkeypatch.setattr(time, "perf_counter", lambda: 1000.0)
        else:
            real = time.time
            self.monkeypatch.setattr(time, "time", lambda: real() - 86400)


@pytest.mark.parametrize("what", ["frozen", "back"])
def test_a_frozen_or_backward_clock_changes_nothing_and_no_duration_is_negative(tmp_path, monkeypatch, what):
    import torch

    from yxanul.config import DEFAULT_CONFIG, parse_args
    from yxanul.tracking import read_metrics
    from yxanul.training import train

    torch.set_num_threads(1)
    cfg = parse_args(["--config", DEFAULT_CONFIG, *FAST, "--max_steps", "3", "--checkpoint_freq", "0",
                      "--output_dir", str(tmp_path / "r")])
    summary = train(cfg, callbacks=[_Clock(monkeypatch, what)])
    assert summary["steps"] == 3 and summary["wall_time_s"] >= 0
    rows = [r for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 3 and all(r["tokens_per_sec"] > 0 or what == "frozen" for r in rows)
