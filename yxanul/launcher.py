"""`yxanul launch [accelerate launch args] train.py|-m yxanul train [flags]`: `accelerate launch`, with
yxanul's one-line errors for the whole job.

Under `accelerate launch` a user mistake (bad flag, file, config value) is printed once by rank 0 and
every rank exits 2, but accelerate's launcher then re-raises torchrun's ``ChildFailedError``: about 40
lines of traceback after the one line, and exit code 1. `yxanul launch` runs accelerate's own launcher
(``accelerate.commands.launch``, same parser, same config files and defaults) in this process and reads
the failure it raises: when the first worker to fail exited with the user-error code (2), the job ends
like `yxanul train`: the worker's one line, exit 2, and torchrun's "failed (exitcode: 2)" / "Sending
process N closing signal" records are dropped. A rank killed by a signal that torchrun did not send (the
out-of-memory killer's SIGKILL) printed nothing: one line names it, exit 128 + the signal. Any other failure
keeps accelerate's full output (those records, then the traceback) and its exit code, 1.

Why in this process and not a child `accelerate launch` whose stderr is filtered: the workers keep the
terminal (not a pipe) as stdout/stderr, the failure is read from torchrun's exception (the exit code of
each rank) instead of parsed from text, and stop signals reach the workers once. torchrun starts each
worker in its own session and forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT itself (``TORCHELASTIC_SIGNALS_TO_
HANDLE``), so a Ctrl-C in the terminal is delivered once and the trainer's preemption checkpoint happens;
it then raises ``SignalException``, which ends here as one line and exit code 128 + the signal. The
one-process launcher (no torchrun: a plain ``subprocess.Popen``) forwards nothing itself: here SIGTERM
goes on to its worker, and SIGINT too unless the worker already got it from the terminal (same process
group), because a second SIGINT tells the trainer not to wait for the checkpoint. Before any worker exists
(a node waiting in the rendezvous for the others), either signal ends the launcher: one line, 128 + the
signal (``StopBeforeWorkers``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import yaml

from .errors import PEER_LOST_EXIT_CODE, UserError

USAGE = "yxanul launch [accelerate launch args] train.py|-m yxanul train [training flags]"
ELASTIC_LOGGER = "torch.distributed.elastic.multiprocessing.api"  # torchrun's per-worker failure records
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _not_accelerates_defaults_notice(record: logging.LogRecord) -> bool:
    """accelerate's "The following values were not passed ... had defaults used instead" (5 lines on stderr at every
    launch without a config file: num_machines 1, mixed_precision no, dynamo_backend no): the defaults yxanul
    documents, not something to act on; the line of a real mistake stays the only one."""
    return "had defaults used instead" not in record.getMessage()


class HeldRecords(logging.Filter):
    """Holds a logger's WARNING+ records (torchrun's "failed (exitcode: N)", "Sending process N closing
    signal": the end of a job) until the outcome is known: dropped after a user error, emitted otherwise."""

    def __init__(self, logger: logging.Logger):
        super().__init__()
        self.logger, self.records = logger, []
        logger.addFilter(self)

    def filter(self, record):
        if record.levelno < logging.WARNING:
            return True
        self.records.append(record)
        return False

    def close(self, emit: bool) -> None:
        self.logger.removeFilter(self)
        if emit:
            for record in self.records:
                self.logger.handle(record)
        self.records = []


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    parser = launch_command_parser()
    parser.prog, parser.usage = "yxanul launch", USAGE
    parser.error = _one_line  # accelerate's argparse prints its usage, then the error: one line instead
    logging.getLogger("accelerate.commands.launch").addFilter(_not_accelerates_defaults_notice)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    check_counts(args)
    waiting = check_the_head_node(args)
    cpu_processes_through_torchrun(args)
    held = HeldRecords(logging.getLogger(ELASTIC_LOGGER))
    previous = {sig: signal.signal(sig, forward_to_children) for sig in STOP_SIGNALS}  # torchrun replaces them
    stopper = StopBeforeWorkers(waiting)
    try:
        if waiting:  # a silent wait for a node that does not come looks like a hang
            print(f"yxanul launch: {waiting} ...", flush=True)
        return launch(launch_command, args, held)
    finally:
        stopper.close()
        held.close(emit=True)  # a no-op once launch() decided
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_the_head_node(args) -> str:
    """Several machines meet at ``main_process_ip``: without one (multi_node_fp8.yaml leaves it to the job script)
    torchrun tried to reach 'None:29500' for 15 minutes, printing only C++ socket warnings. Returns what this node
    waits for at the start ("node 0 of 2: waiting for 1 more node at HOST:PORT"), "" on one machine."""
    config = _config_file(args)
    machines = args.num_machines or config.get("num_machines") or 1
    if not isinstance(machines, int) or machines < 2:
        return ""
    ip = args.main_process_ip or config.get("main_process_ip")
    if not ip:
        raise UserError(f"yxanul launch: {machines} machines meet at the head node: pass --main_process_ip (its "
                        "address, the same on every node) and --machine_rank, or --num_machines 1")
    port = args.main_process_port or config.get("main_process_port") or 29500  # accelerate's default
    rank = args.machine_rank if args.machine_rank is not None else config.get("machine_rank") or 0
    others = machines - 1
    return f"node {rank} of {machines}: waiting for {others} more node{'s' if others > 1 else ''} at {ip}:{port}"


def check_counts(args) -> None:
    """``--num_processes``/``--num_machines`` of 0 or less: accelerate took them (a negative count of processes
    even trained, on one); one line instead."""
    for flag in ("num_processes", "num_machines"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UserError(f"yxanul launch: --{flag} expected a whole number of at least 1, got {value}")


def _config_file(args) -> dict:
    """The accelerate config file (``--config_file``, else accelerate's default one if it exists), read before
    accelerate's launch command acts on it: a file whose top level is not a mapping (empty, a list) ended in an
    AttributeError traceback inside accelerate; one line naming the file instead. {} when there is none, or when it
    is not valid YAML/JSON (accelerate reports that in one line)."""
    from accelerate.commands.config.config_args import default_config_file

    path = Path(args.config_file) if args.config_file else Path(default_config_file)
    if not path.is_file():
        return {}  # a --config_file that is not there: accelerate's own one line
    try:
        text = path.read_text(encoding="utf-8")
        config = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        return {}
    if not isinstance(config, dict):
        got = "an empty file" if config is None else f"a {type(config).__name__}"
        raise UserError(f"yxanul launch: the accelerate config file '{path}': expected a mapping of keys "
                        f"(compute_environment: ..., num_processes: ...), got {got}")
    return config


def _one_line(message: str):
    raise UserError(f"yxanul launch: {message} (`yxanul launch --help`)")


def cpu_processes_through_torchrun(args) -> None:
    """``--cpu --num_processes N`` with N > 1: accelerate's ``--cpu`` launcher starts ONE process (several only
    through ``--mpirun_hostfile`` and an MPI install), so the job would silently train on one. N gloo ranks are
    what ``accelerate_configs/cpu.yaml`` starts: torchrun (``--multi_gpu``) with ``ACCELERATE_USE_CPU=1``
    (docs/distributed.md, "Why cpu.yaml says MULTI_GPU")."""
    n = args.num_processes or 1
    if not args.cpu or n < 2 or args.mpirun_hostfile:
        return
    args.cpu, args.multi_gpu = False, True
    os.environ["ACCELERATE_USE_CPU"] = "1"  # torchrun's workers inherit it; their Accelerator then runs on gloo
    print(f"yxanul launch: --cpu --num_processes {n}: {n} gloo processes through torchrun (accelerate's --cpu "
          "launcher alone would start one)", flush=True)  # a note, on stdout: stderr is for what went wrong


def launch(launch_command, args, held: HeldRecords) -> int:
    """accelerate's launcher -> an exit code. A user error: its code (the worker printed the line)."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch_command(args)
        return 0
    except ChildFailedError as e:  # torchrun: the exit code (or -signal) of each failed rank
        killed = _killed_line(e.failures)
        if killed:
            held.close(emit=False)  # torchrun's "failed (exitcode: -9)" records: the line below says it
            print(killed[0], file=sys.stderr, flush=True)
            return killed[1]
        if _another_node_lost_a_process(e.failures):
            held.close(emit=False)  # each rank printed its "another process of the job is gone" line
            return PEER_LOST_EXIT_CODE
        return _failed(_user_error_or_first(e.failures), held)
    except subprocess.CalledProcessError as e:  # the one-process launcher (and DeepSpeed's multi-node one)
        return _failed(e.returncode, held)
    except SignalException as e:
        held.close(emit=True)
        print(f"launcher received {e.sigval.name}: forwarded to the workers (a training run saves a checkpoint "
              "before it stops)", file=sys.stderr, flush=True)
        return 128 + int(e.sigval)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        if not _before_any_worker(e):
            raise
        # accelerate's own checks of the command and its config file (a missing file, an FP8 profile where no
        # FP8 backend imports): the user's mistake, one line
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise UserError(f"accelerate launch: {first}") from None


def _before_any_worker(e: BaseException) -> bool:
    """Raised by accelerate's launch command itself, before torch's launcher or a subprocess started a worker."""
    files = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(e.__traceback__)]
    return any("accelerate" in f for f in files) and not any(
        ("torch" in f and "distributed" in f) or f.endswith("subprocess.py") for f in files)


CLOSING_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # what torchrun sends the rest of a job after one rank failed


def _killed_line(failures) -> tuple[str, int] | None:
    """(one line, 128 + the signal) when a rank of this node was killed by a signal that torchrun did not send
    (SIGKILL from the out-of-memory killer or a scheduler, SIGSEGV): it printed nothing, and the others' errors
    ("another process of the job is gone") and torchrun's traceback would bury it. None: no such rank."""
    killed = {rank: f for rank, f in failures.items() if f.exitcode < 0 and -f.exitcode not in CLOSING_SIGNALS}
    if not killed:
        return None
    rank = min(killed, key=lambda r: (killed[r].timestamp, r))
    f = killed[rank]
    name = f.signal_name()
    why = " (the kernel's out-of-memory killer sends it: `dmesg` says; or a scheduler's limit)" if name == "SIGKILL" \
        else ""
    return (f"error: rank {rank} (local rank {f.local_rank} on {socket.gethostname()}, pid {f.pid}) was killed by "
            f"{name}{why}; the job's other processes stopped; the same command with --resume latest continues from "
            "the last checkpoint", 128 - f.exitcode)


def _another_node_lost_a_process(failures) -> bool:
    """Whether this node's ranks stopped only because a process of another node is gone (killed there: that
    node's launcher names it in its one line): a rank here said so and exited 4, the others too or were stopped by
    torchrun. That line is the whole story here: torchrun's ChildFailedError report would only bury it."""
    codes = [f.exitcode for f in failures.values()]
    return PEER_LOST_EXIT_CODE in codes and all(
        c == PEER_LOST_EXIT_CODE or (c < 0 and -c in CLOSING_SIGNALS) for c in codes)


def _user_error_or_first(failures) -> int:
    """2 when ranks exited 2 and the others were stopped by a signal (torchrun stops the rest of the job
    when one rank exits), else the first failure's code. Global rank 0 prints a user error; when it was
    stopped before it could (another rank failed first: multi-node, or a slow rank 0), one line says so."""
    codes = {rank: f.exitcode for rank, f in failures.items()}
    if UserError.exit_code not in codes.values() or any(c > 0 and c != UserError.exit_code for c in codes.values()):
        return codes[min(failures, key=lambda r: failures[r].timestamp)]
    if codes.get(0) != UserError.exit_code:
        rank = min(r for r, c in codes.items() if c == UserError.exit_code)
        print(f"error: rank {rank} stopped on a user error (exit code 2) before global rank 0 printed it; rank 0's "
              "output says what (on node 0), as does `yxanul train` with the same flags", file=sys.stderr, flush=True)
    return UserError.exit_code


def _failed(worker_code: int, held: HeldRecords) -> int:
    """A user error: the worker printed its line; nothing more, its code. Anything else: what `accelerate
    launch` shows (torchrun's records, the traceback) and its exit code, 1. Call it in an ``except`` block."""
    held.close(emit=worker_code != UserError.exit_code)
    if worker_code == UserError.exit_code:
        return worker_code
    traceback.print_exc()
    return 1


def forward_to_children(signum, _frame) -> None:
    """SIGTERM/SIGINT while the one-process launcher waits: passed on to its worker, which checkpoints and
    exits (and the launcher with it). A SIGINT is not passed to a child that the terminal's Ctrl-C already
    reached (same process group, the terminal's foreground one): a second SIGINT would tell the trainer not
    to wait for its checkpoint. With no child yet, the signal stops the launcher."""
    import psutil

    children = psutil.Process().children()
    if not children:
        if StopBeforeWorkers.watching:  # its thread got the same signal and stops the launcher with one line
            return
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)
    for child in children:
        try:
            if signum != signal.SIGINT or not _terminal_interrupted(os.getpgid(child.pid)):
                child.send_signal(signum)
        except (psutil.Error, OSError):  # already gone
            pass


def _terminal_interrupted(pgid: int) -> bool:
    """Whether a Ctrl-C reached process group ``pgid`` itself: it is this process's group and the
    foreground group of the terminal on stdin."""
    try:
        return pgid == os.getpgrp() == os.tcgetpgrp(sys.stdin.fileno())
    except (OSError, ValueError):  # no terminal: the signal came from kill, to this process alone
        return False


class StopBeforeWorkers:
    """SIGTERM/SIGINT before any worker exists (the rendezvous: torchrun waits for the other nodes in C++, in
    ``TCPStore``'s constructor, up to 15 minutes) stop the launcher: one line, exit 128 + the signal. A Python
    signal handler runs only when the main thread is back in Python, which that wait never is: alone, it would
    leave both signals unanswered until SIGKILL. The interpreter's C handler also writes the signal's number to
    the wakeup fd, and the wait releases the GIL, so a thread reading that fd can act. Once torchrun has started
    its workers (its own handlers replace ``forward_to_children``) or the one-process launcher has a child, it
    does nothing: the signal goes to the workers, which checkpoint."""

    watching = False

    def __init__(self, waiting: str):
        import psutil

        self.waiting = f" ({waiting})" if waiting else ""
        self._process = psutil.Process()  # ready: the line should come before anything the signal makes C++ print
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)  # the C handler must never block
        self._previous = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        StopBeforeWorkers.watching = True
        threading.Thread(target=self._watch, name="yxanul-launch-stop", daemon=True).start()

    def _watch(self) -> None:
        with self._read:
            while data := self._read.recv(64):  # b"": close() shut the other end
                for signum in data:
                    if signum in STOP_SIGNALS and self._no_worker_yet(signum):
                        self._stop(signum)

    def _no_worker_yet(self, signum: int) -> bool:
        return signal.getsignal(signum) is forward_to_children and not self._process.children()

    def _stop(self, signum: int) -> None:
        try:
            sys.stdout.flush()
            print(f"launcher received {signal.Signals(signum).name} before any worker started{self.waiting}: "
                  "stopped", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # a closed stream: the exit code still says it
            pass
        os._exit(128 + signum)  # the main thread is in C++ until the rendezvous times out: it cannot unwind

    def close(self) -> None:
        StopBeforeWorkers.watching = False
        signal.set_wakeup_fd(self._previous)
        self._write.close()  # the thread reads EOF and ends
