"""Fault-injection suite helpers: the real CLI in subprocesses (`popen`) or in this process (`yx_here`)."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXIT_BOUND_S = 60  # "within seconds" on 2 shared cores: start-up included, far below any hang


def env():
    # one intra-op thread: a nano step takes ~0.1 s instead of 1-4 s when 2 threads compete with the rest of
    # a loaded 2-core CI box (same losses; every run of the suite uses the same setting, so bit-identity holds)
    e = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
             MKL_NUM_THREADS="1")
    e.pop("WANDB_API_KEY", None)
    return e


def yx_here(*args):
    """The real CLI (`yxanul.cli.main`) in this process, for what needs no process of its own (one-line
    errors, resume choices, a run that stops itself): saves an interpreter + torch start-up per call.
    One intra-op thread as in `env()`; the signal handlers `yxanul train` installs are put back."""
    import torch

    from yxanul.cli import main

    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGINT)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        from accelerate.state import AcceleratorState, GradientState, PartialState

        AcceleratorState._reset_state(True)  # process-wide singletons: the next run decides its own
        GradientState._reset_state()
        PartialState._reset_state()
        torch.set_num_threads(threads)
        for s, h in handlers.items():
            signal.signal(s, h)
    return subprocess.CompletedProcess(["yxanul", *args], code, out.getvalue(), err.getvalue())


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def one_line(r, code: int, needle: str):
    """Exit ``code``, stderr exactly one line containing ``needle``, no traceback."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and len(lines) == 1 and needle in lines[0], r.stderr[-3000:]


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def popen(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "yxanul", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env(), **kw)


def wait_for(path: Path, timeout=180.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def kill_group(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
