"""`yxanul launch`: accelerate's real launcher (torchrun with the CPU profile's 2 gloo processes, or the
one-process launcher) around the real trainer; only the job's ending differs from `accelerate launch`."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_run import FAST

ROOT = Path(__file__).resolve().parents[2]
TWO = ["--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml")]  # torchrun, 2 processes
ONE = ["--cpu", "--num_processes", "1"]  # accelerate's one-process launcher (subprocess.Popen)
# the tiny run at micro-batch 2 with a one-step warmup, a step line every 10 steps (the default)
RUN = [*FAST, "--micro_batch_size", "2", "--warmup_steps", "1", "--log_freq", "10"]
LAUNCHER_RECORDS = ("Traceback", "ChildFailedError", "CalledProcessError", "failed (exitcode", "closing signal")


def _env():
    return dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def _cmd(*args):
    return [sys.executable, "-m", "yxanul", "launch", *args]


def _launch(*args, cwd):
    return subprocess.run(_cmd(*args), capture_output=True, text=True, env=_env(), cwd=cwd, timeout=300)


def _error_lines(r):
    return [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("error: ")]


def test_a_user_error_is_one_line_and_exit_2_for_the_whole_job(tmp_path):
    """Both ranks refuse --warmup_steps 50 > --max_steps 20 before training; rank 0 prints the line. Under
    `accelerate launch` the same job ends with torchrun's ChildFailedError traceback and exit 1."""
    for launcher in (TWO, ONE, ["--cpu", "--num_processes", "2"]):
        r = _launch(*launcher, "-m", "yxanul", "train", "--max_steps", "20", "--warmup_steps", "50",
                    "--output_dir", str(tmp_path / "r"), cwd=tmp_path)
        out = r.stdout + r.stderr
        assert r.returncode == 2, out[-3000:]
        assert len(_error_lines(r)) == 1 and "config key 'warmup_steps': expected less than max_steps (20)" in out
        # stderr is the line alone: no accelerate "defaults used instead" notice, yxanul's own note on stdout
        assert r.stderr.strip().splitlines() == _error_lines(r), r.stderr[-3000:]
        assert not [s for s in LAUNCHER_RECORDS if s in out], out[-3000:]
        assert not (tmp_path / "r").exists()


RANKS_REFUSE = """import os, sys, time
from yxanul.cli import run
from yxanul.errors import UserError

def refuse(argv):
    if os.environ["RANK"] == "0":
        time.sleep(float(sys.argv[1]))  # rank 0 reaches the same mistake later than rank 1
    raise UserError("the same mistake on every rank")

sys.exit(run(refuse, []))
"""


def test_rank_0_reports_a_user_error_though_another_rank_gets_there_first(tmp_path):
    """Rank 1 refuses 1 s before rank 0: torchrun stops the job at the first exit, so rank 1 waits before
    its quiet exit and rank 0's line is the one printed. A rank 0 that never reports (30 s late: stopped by
    torchrun) still leaves one line, naming the rank that stopped the job."""
    script = tmp_path / "refuse.py"
    script.write_text(RANKS_REFUSE)
    for delay, line in (("1", "error: the same mistake on every rank"),
                        ("30", "error: rank 1 stopped on a user error (exit code 2) before global rank 0 printed it")):
        r = _launch(*TWO, str(script), delay, cwd=tmp_path)
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
        assert len(_error_lines(r)) == 1 and _error_lines(r)[0].startswith(line), r.stderr[-3000:]
        assert not [s for s in LAUNCHER_RECORDS if s in r.stderr], r.stderr[-3000:]


def test_any_other_failure_keeps_the_launchers_output_and_exit_code(tmp_path):
    """A worker that crashes (a bug, exit 1) is not a user error: torchrun's records and traceback stay,
    exit 1, as with `accelerate launch`."""
    script = tmp_path / "crash.py"
    script.write_text("raise RuntimeError('a bug in the training script')\n")
    r = _launch(*TWO, str(script), cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "RuntimeError: a bug in the training script" in r.stderr
    for record in ("failed (exitcode: 1)", "Traceback", "ChildFailedError", "exitcode  : 1"):
        assert record in r.stderr, r.stderr[-3000:]


# the profile file is what users launch with; the flag spelling reaches the same accelerate launch (slow: 20 s)
@pytest.mark.parametrize("launcher", [TWO, pytest.param(["--cpu", "--num_processes", "2"], marks=pytest.mark.slow)],
                         ids=["cpu_yaml", "cpu_flag"])
def test_a_tiny_two_process_run_exits_0(tmp_path, launcher):
    """The CPU profile, and `--cpu --num_processes 2` (accelerate alone: one process), both train 2 gloo ranks."""
    from yxanul.training.state import read_state_file

    env = {k: v for k, v in _env().items() if k != "ACCELERATE_USE_CPU" or launcher is TWO}  # the flag needs none
    r = subprocess.run(_cmd(*launcher, "-m", "yxanul", "train", *RUN, "--max_steps", "2", "--output_dir",
                            str(tmp_path / "r")), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "done: 2 steps" in r.stdout and not _error_lines(r)
    assert (tmp_path / "r" / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert read_state_file(tmp_path / "r" / "checkpoints" / "step_2")[1].world_size == 2


def _signal_after_first_step(launcher, out, tmp_path, sig=signal.SIGTERM, rank=None):
    """Starts a long run, sends ``sig`` once step 1 is logged: to the `yxanul launch` process alone, or (``rank``)
    to that rank's worker alone. Returns (exit code, stdout, stderr, the pid signalled)."""
    import psutil

    proc = subprocess.Popen(_cmd(*launcher, "-m", "yxanul", "train", *RUN, "--max_steps", "100000",
                                 "--log_freq", "100000", "--checkpoint_freq", "0", "--output_dir", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    tree = []
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not (out / "metrics.jsonl").exists():
            time.sleep(0.2)
        tree = psutil.Process(proc.pid).children(recursive=True)  # to clean up if the launcher fails to
        target = proc if rank is None else next(  # the worker itself, not its DataLoader or compile children
            p for p in tree if p.environ().get("RANK") == str(rank) and p.parent().environ().get("RANK") is None)
        target.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        for p in [*tree, proc]:
            try:
                p.kill()
            except (psutil.Error, OSError):
                pass
    return proc.returncode, stdout, stderr, target.pid


def test_a_rank_killed_by_sigkill_is_named_in_one_line_not_a_bug_report(tmp_path):
    """The out-of-memory killer's SIGKILL to one rank: rank 0's next collective fails. Before, rank 0 printed gloo's
    error as "internal error ... a bug in yxanul" with a traceback and the launcher torchrun's 40 lines, exit 1.
    Now rank 0 says a process of the job is gone, the launcher names which (rank, pid, signal), exit 128 + 9."""
    code, stdout, stderr, pid = _signal_after_first_step(TWO, tmp_path / "r", tmp_path, signal.SIGKILL, rank=1)
    assert code == 128 + signal.SIGKILL, stdout[-2000:] + stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert any(ln.startswith("error: rank 1 (local rank 1 on ") and f"pid {pid}) was killed by SIGKILL" in ln
               for ln in lines), stderr[-3000:]
    assert [ln for ln in lines if "another process of the job is gone" in ln][0].startswith("error: rank 0 of 2: ")
    assert not [s for s in (*LAUNCHER_RECORDS, "internal error") if s in stderr], stderr[-3000:]



def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(rank, port, *args, cwd):
    """`yxanul launch` as node ``rank`` of a 2-node job whose head node is this machine (one process per node)."""
    return subprocess.Popen(_cmd(*TWO, "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
                                 "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd)


def _wait_until(condition, proc, what, timeout=240):
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            stdout, stderr = proc.communicate(timeout=90)
            pytest.fail(f"{what} (exit code {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}")
        time.sleep(0.2)


def _stop_all(*procs):
    import psutil

    for proc in procs:
        try:
            for p in [*psutil.Process(proc.pid).children(recursive=True), proc]:
                p.kill()
        except (psutil.Error, OSError):  # already gone
            pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_waiting_for_the_other_nodes_stops_the_launcher(tmp_path, sig):
    """Node 0 of 2 waits for node 1, which never comes, in torchrun's rendezvous: a C++ wait (TCPStore) in which no
    Python signal handler runs. Before, the launcher ignored SIGTERM and Ctrl-C there until SIGKILL (up to 15 min).
    Now it says what it waits for, and the signal ends it: one line, exit 128 + the signal."""
    import psutil

    port = _free_port()
    proc = _node(0, port, "-m", "yxanul", "train", *RUN, "--max_steps", "2", "--output_dir", str(tmp_path / "r"),
                 cwd=tmp_path)
    try:  # the head node's store listens: the launcher is in the rendezvous wait
        _wait_until(lambda: any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                                for c in psutil.Process(proc.pid).net_connections("tcp")), proc, "no rendezvous")
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        _stop_all(proc)
    waiting = f"node 0 of 2: waiting for 1 more node at 127.0.0.1:{port}"
    assert proc.returncode == 128 + sig, stdout[-2000:] + stderr[-3000:]
    assert f"yxanul launch: {waiting} ..." in stdout.splitlines(), stdout[-2000:]
    assert stderr.strip().splitlines() == [f"launcher received {sig.name} before any worker started ({waiting}): "
                                           "stopped"], stderr[-3000:]
    assert not (tmp_path / "r").exists()


def test_a_rank_killed_on_another_node_is_one_line_on_each_node(tmp_path):
    """Two nodes (launchers) on this machine, one rank each; SIGKILL to node 1's rank. Node 1's launcher names it
    (exit 128 + 9). Node 0's rank says another process of the job is gone; before, node 0's launcher then printed
    torchrun's ChildFailedError report (~30 lines, exit 1). Now that line is node 0's whole output, exit 4."""
    import psutil

    port, out = _free_port(), tmp_path / "r"
    args = ["-m", "yxanul", "train", *RUN, "--max_steps", "100000", "--log_freq", "100000", "--checkpoint_freq", "0",
            "--output_dir", str(out)]
    nodes = [_node(rank, port, *args, cwd=tmp_path) for rank in (0, 1)]
    try:
        _wait_until(lambda: (out / "metrics.jsonl").exists(), nodes[0], "no first step")
        worker = next(p for p in psutil.Process(nodes[1].pid).children(recursive=True)
                      if p.environ().get("RANK") == "1" and p.parent().environ().get("RANK") is None)
        worker.kill()
        (_, err0), (_, err1) = (node.communicate(timeout=120) for node in nodes)
    finally:
        _stop_all(*nodes)
    assert nodes[1].returncode == 128 + signal.SIGKILL, err1[-3000:]
    assert err1.strip().splitlines()[-1].startswith("error: rank 1 (local rank 0 on "), err1[-3000:]
    assert f"pid {worker.pid}) was killed by SIGKILL" in err1
    assert nodes[0].returncode == 4, err0[-3000:]
    lines = [ln for ln in err0.splitlines() if ln.strip() and "examples/s]" not in ln and "tok/s]" not in ln]
    assert len(lines) == 1 and lines[0].startswith("error: rank 0 of 2: another process of the job is gone ("), lines


def _saved_step(stdout, out, sig=signal.SIGTERM):
    step = int((out / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert f"received {sig.name}: checkpoint saved at step {step}, exiting" in stdout, stdout
    assert f"stopped at step {step} of 100000 (checkpoint saved; the same command with --resume latest " \
           f"--output_dir {out} continues)" in stdout, stdout
    return step


@pytest.mark.slow  # 15-30 s here; the one-process test below is the fast representative
def test_sigterm_reaches_both_torchrun_workers_which_checkpoint(tmp_path):
    """torchrun forwards the launcher's SIGTERM to its workers: both stop on the same step after one
    checkpoint; the launcher ends with one line and 128 + SIGTERM, no traceback."""
    out = tmp_path / "r"
    code, stdout, stderr, _ = _signal_after_first_step(TWO, out, tmp_path)
    assert code == 128 + signal.SIGTERM, stdout[-2000:] + stderr[-3000:]
    assert _saved_step(stdout, out) >= 1
    assert stderr.count("launcher received SIGTERM: forwarded to the workers") == 1
    assert "Traceback" not in stderr and "SignalException" not in stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_reaches_the_one_process_launchers_worker(tmp_path, sig):
    """accelerate's one-process launcher forwards nothing: `yxanul launch` passes SIGTERM (and a SIGINT
    sent to it alone, not through a terminal) on, the worker checkpoints and exits 0, and so does the launcher."""
    out = tmp_path / "r"
    code, stdout, stderr, _ = _signal_after_first_step(ONE, out, tmp_path, sig)
    assert code == 0, stdout[-2000:] + stderr[-3000:]
    assert _saved_step(stdout, out, sig) >= 1


def test_accelerates_own_refusals_before_any_worker_are_one_line(tmp_path):
    """A config file that is not there, and an FP8 profile where no FP8 backend imports (the CPU: fsdp2.yaml
    without --mixed_precision no): accelerate's launch command raises before a worker exists."""
    from accelerate.utils import is_fp8_available

    cases = [(["--config_file", str(tmp_path / "none.yaml")], "the passed configuration file")]
    if not is_fp8_available():  # where an FP8 backend imports, accelerate launches it
        cases.append((["--config_file", str(ROOT / "accelerate_configs" / "fsdp2.yaml"), "--num_processes", "2"],
                      "fp8 is not available on this machine"))
    for args, needle in cases:
        r = _launch(*args, "-m", "yxanul", "train", *RUN, "--max_steps", "2", cwd=tmp_path)
        out = (r.stdout + r.stderr).strip().splitlines()
        assert r.returncode == 2 and len(out) == 1 and out[0].startswith("error: accelerate launch: "), out[-5:]
        assert needle in out[0].lower()


def test_a_launch_flag_mistake_is_one_line_not_accelerates_usage_and_error(capsys):
    """Also several machines without the head node's address (multi_node_fp8.yaml leaves it to the job script):
    torchrun tried 'None:29500' for 15 minutes, ignoring SIGTERM."""
    from yxanul.cli import main as cli

    multi = ["--config_file", str(ROOT / "accelerate_configs" / "multi_node_fp8.yaml"), "--mixed_precision", "no"]
    for argv, needle in ((["--num_processes", "abc", "-m", "yxanul", "train"], "invalid int value: 'abc'"),
                         ([], "the following arguments are required"),
                         ([*multi, "-m", "yxanul", "train"], "2 machines meet at the head node: pass --main_process"),
                         (["--num_machines", "3", "--cpu", "-m", "yxanul", "train"], "3 machines meet")):
        assert cli(["launch", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: yxanul launch: ") and needle in err[0], err


def test_a_config_file_that_is_not_a_mapping_and_a_count_below_1_are_one_line(tmp_path, capsys):
    """An empty accelerate config file, or one whose top level is a list, ended in accelerate's AttributeError
    traceback; --num_processes -3 (or 0) was taken and a run trained on one process."""
    from yxanul.cli import main as cli

    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- num_processes: 2\n")
    (tmp_path / "list.json").write_text("[1, 2]")
    cases = [(["--config_file", str(tmp_path / name)], f"'{tmp_path / name}': expected a mapping") for name in
             ("empty.yaml", "list.yaml", "list.json")]
    cases += [(["--num_processes", n, "--cpu"], f"--num_processes expected a whole number of at least 1, got {n}")
              for n in ("-3", "0")]
    cases.append((["--num_machines", "0", "--cpu"], "--num_machines expected a whole number of at least 1"))
    for argv, needle in cases:
        assert cli(["launch", *argv, "-m", "yxanul", "train", "--max_steps", "1"]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: yxanul launch: ") and needle in err[0], err


@pytest.mark.slow  # three launches (~50 s on 2 cores); the fast siblings: test_a_user_error_is_one_line_and_exit_2_*
def test_a_run_directory_mistake_after_the_process_group_exists_is_still_one_line(tmp_path):
    """The run directory is checked after the process group exists (the default name is rank 0's), and every rank
    finds the same mistake: rank 0 prints it, the other exits quietly (it printed it too, once per rank)."""
    out = tmp_path / "r"
    first = _launch(*ONE, "-m", "yxanul", "train", *RUN, "--max_steps", "2", "--output_dir", str(out), cwd=tmp_path)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    r = _launch(*TWO, "-m", "yxanul", "train", *RUN, "--max_steps", "2", "--output_dir", str(out), cwd=tmp_path)
    assert r.returncode == 2 and _error_lines(r) == [f"error: output_dir '{out}' already holds checkpoints (newest: "
                                                     "step 2): add --resume latest to continue that run, or choose "
                                                     "another --output_dir/--run_name"], (r.stdout + r.stderr)[-3000:]
    # the batch plan (and the curriculum, a resume's data settings) also read only what every rank shares
    r = _launch(*TWO, "-m", "yxanul", "train", *RUN, "--max_steps", "2", "--micro_batch_multiple", "3",
                "--output_dir", str(tmp_path / "r2"), cwd=tmp_path)
    assert r.returncode == 2 and len(_error_lines(r)) == 1, (r.stdout + r.stderr)[-3000:]
    assert "config key 'micro_batch_size': expected a multiple of 3" in _error_lines(r)[0]
