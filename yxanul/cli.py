"""`yxanul <command>`: one entry point; each command lives in the module that owns it."""

from __future__ import annotations

import importlib
import os
import re
import sys
import time

from . import __version__
from .checkpoint import listing, run_dir_of
from .config import parse_args
from .config_file import with_default_config
from .errors import DISK_FULL, PEER_LOST_EXIT_CODE, ConfigError, EveryRankError, UserError, first_line, path_error_line
from .tracking import quiet_tensorboard_writer_thread, tensorboard_logdir

# command -> (module, function, one-line help)
COMMANDS = {
    "train": ("yxanul.cli", "train_main", "pretrain a model (default: the embedded demo config)"),
    "launch": ("yxanul.launcher", "main", "`accelerate launch ...` whose user errors are one line, exit 2, per job"),
    "prepare": ("yxanul.tools.prepare", "main", "tokenize and pack a dataset into token shards"),
    "bench-data": ("yxanul.data.bench_data", "main",
                   "raw tokenizer vs the prepare pipeline, tokens/s per process count"),
    "tokenizer": ("yxanul.data.tokenizer_train", "main", "train a byte-level BPE tokenizer (`yxanul tokenizer train`)"),
    "checkpoints": ("yxanul.checkpoint.table", "main",
                    "list the checkpoints of a run directory and whether each verifies"),
    "verify": ("yxanul.tools.verify", "main", "check the FP8 stack (GPU, CUDA, TE, accelerate)"),
    "lint-config": ("yxanul.tools.lint_config", "main", "lint DeepSpeed JSON / accelerate YAML configs (--fix)"),
    "find-batch": ("yxanul.tools.find_batch", "main", "find the largest micro-batch that fits"),
    "plan": ("yxanul.planning.cli", "main", "memory per GPU under DDP/ZeRO/FSDP2/HSDP, what fits, the launch line"),
    "plot-lr": ("yxanul.tools.plot_lr", "main", "plot the learning-rate schedule to a PNG"),
    "bench": ("yxanul.tools.bench", "main", "measure training throughput, MFU and memory per preset and precision"),
    "compare": ("yxanul.tools.compare", "main", "plot and compare the loss curves of runs (e.g. BF16 vs FP8)"),
    "sweep": ("yxanul.sweep", "main", "run a W&B sweep file (sweeps/*.yaml) online with wandb.agent, or offline here"),
    "export": ("yxanul.hub.export", "main", "export a run/checkpoint as a Llama (or yxanul) folder for transformers"),
    "push": ("yxanul.hub.push", "main", "push a run or export to the Hugging Face Hub with a model card"),
    "generate": ("yxanul.evaluation.generate", "main", "generate text from a run, checkpoint or export (streamed)"),
    "eval": ("yxanul.evaluation.run", "main", "val loss/perplexity, multiple-choice tasks, lm-eval benchmarks by name"),
    "grpo": ("yxanul.finetune.grpo", "main", "GRPO (TRL) on multiple-choice QA (MedQA/USMLE shape), SFT first"),
}


def train_main(argv: list[str] | None = None) -> int:
    """`yxanul train [--config FILE] [--flag value ...]` and `accelerate launch train.py ...`."""
    argv = with_default_config(list(sys.argv[1:] if argv is None else argv))
    stops = OutsideTheLoop().install()  # the trainer's StopRequest takes SIGTERM/SIGUSR1 over during its loop
    try:
        cfg = parse_args(argv)
        if cfg.checkpoint.list_checkpoints:
            if cfg.checkpoint.output_dir is None and cfg.checkpoint.run_name is None:  # the default is new each time
                raise ConfigError("list_checkpoints", "--output_dir RUN_DIR or --run_name NAME with it (or `yxanul "
                                  "checkpoints RUN_DIR`): the default run directory is new at every launch", True)
            if os.environ.get("RANK", "0") == "0":  # under a launcher every rank gets the flag: one table per job
                print(listing(run_dir_of(cfg)))
            return 0
        from .training import from_config, train  # torch: --help and config errors stay light

        train(cfg, [*from_config(cfg), stops])  # its setup runs the launch checks (training.launch.preflight) first
    except StoppedBeforeTraining as e:
        print(f"received {e} before training started: nothing to save; exiting", flush=True)
        return _stopped_code(str(e))
    finally:
        if not OutsideTheLoop.until_exit:  # an in-process caller (a test, a notebook) gets its handlers back
            stops.restore()
        else:  # the interpreter's exit sets Python handlers back to the default (killed, 143) and a raise in an atexit
            stops.ignore()  # callback is a traceback: a late stop signal lets the process finish its exit and code
    return 0


def _stopped_code(name: str) -> int:
    """0 alone (nothing ran: preemption); 128 + the signal where a launcher started other processes: exit 0 would
    let torchrun wait for them, while they wait at the next collective for this one, forever. A non-zero exit
    makes torchrun stop the job; a scheduler that signalled every rank gets them all the same way."""
    import signal

    return 128 + signal.Signals[name].value if int(os.environ.get("WORLD_SIZE") or 1) > 1 else 0


class StoppedBeforeTraining(BaseException):
    """SIGTERM/SIGUSR1/SIGHUP before the training loop's own handler exists (data preparation, model
    build, resume load): nothing to save, so the run ends at once (exit code: `_stopped_code`)."""


class OutsideTheLoop:
    """SIGTERM/SIGUSR1/SIGHUP outside the training loop. Before it: nothing to save, the run ends at once
    (`StoppedBeforeTraining`, raised to interrupt a long data preparation). After the run ended (`on_train_end`,
    a callback: checkpoint, metrics and summary are written): one line and exit 0 at once; raising there lands in
    the teardown (a DataLoader worker's queue being closed: its lock stayed taken and the process hung). After the
    loop began but not ended, its error is on its way out (torchrun's SIGTERM follows another rank's death):
    ignored, or the error's line and exit code would become "stopped before training", exit 0."""

    SIGNALS = ("SIGTERM", "SIGUSR1", "SIGHUP")
    until_exit = False  # `run(process_exit=True)`: the process ends with the command, so do these handlers

    def __init__(self):
        self.began = self.ended = False
        self.previous: dict = {}

    def on_train_begin(self, trainer) -> None:
        self.began = True

    def on_train_end(self, trainer) -> None:
        self.ended = True

    def install(self) -> OutsideTheLoop:
        import signal

        for sig in (getattr(signal, name) for name in self.SIGNALS if hasattr(signal, name)):
            try:
                self.previous[sig] = signal.signal(sig, self.handle)
            except ValueError:  # not the main thread
                pass
        return self

    def restore(self) -> None:
        import signal

        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def ignore(self) -> None:
        import signal

        for sig in self.previous:
            signal.signal(sig, signal.SIG_IGN)

    def handle(self, signum, _frame) -> None:
        import signal

        name = signal.Signals(signum).name
        if self.began and not self.ended:  # the loop's error is on its way to its line, exit code and exit watchdog
            return
        if not self.ended:
            if self.until_exit:  # whatever the exception interrupts (a DataLoader's queue mid-close), no hang
                _exit_watchdog(0)
            raise StoppedBeforeTraining(name)
        if not self.until_exit:  # an in-process caller's (a notebook's) run has ended: nothing to stop, no exit
            return
        try:
            print(f"received {name} after the run ended (its checkpoint and summary are written): exiting", flush=True)
        finally:
            os._exit(0)


def _usage() -> str:
    lines = ["usage: yxanul <command> [args]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "`yxanul <command> --help` for the flags of a command."]
    return "\n".join(lines)


EXIT_BUG = 1
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `cmd | head` killed by the signal
EXIT_GRACE_S = 20.0     # after an error, the process is gone within this long whatever hangs
QUIET_RANK_EXIT_S = 2.0  # a rank other than 0 exits this long after a user error that rank 0 reports


def run(func, argv, *, process_exit: bool = False) -> int:
    """Call a command. Every way it can end is an exit code, within seconds:
    a UserError -> one line on stderr, its exit code (2; 3 for a diverged run); a full disk, a read-only
    or forbidden path, a file where a folder goes, a link to nothing -> one line naming the file, 2; a closed
    stdout (``| head``) -> one line, 141; Ctrl-C -> 130; a collective whose peer process is gone -> one line, 4;
    any other exception -> its traceback (a bug: report it), then one line, 1.
    ``process_exit``: the process exits with the returned code (the `yxanul` entry points, train.py):
    then, on every error, a watchdog ends the process after ``EXIT_GRACE_S`` if something (a thread,
    a child) would keep it alive. An in-process caller (a test, a notebook) gets the code back and no watchdog."""
    OutsideTheLoop.until_exit = process_exit
    code = _run(func, argv)
    if code != 0 and process_exit:
        _exit_watchdog(code)
    return code


def _run(func, argv) -> int:
    try:
        with quiet_tensorboard_writer_thread():  # its OSError is raised again in this thread: one line below
            return int(func(argv) or 0)
    except UserError as e:
        if not _reports_for_the_job(e):
            _let_rank_0_fail_first()
            return e.exit_code  # the same line is printed by rank 0: one line per job, not per rank
        return _fail(f"error: {e}", e.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:
        _detach_stdout()
        return _fail("error: standard output was closed (broken pipe, e.g. `| head`); stopping", EXIT_BROKEN_PIPE)
    except OSError as e:
        line = _path_error_line(e)
        return _fail(line, 2) if line else _bug(e)
    except Exception as e:  # noqa: BLE001 - the last line of defence: exit, never hang
        line = _peer_lost_line(e)  # its own code: `yxanul launch` then knows the line is printed, and no bug
        return _fail(line, PEER_LOST_EXIT_CODE) if line else _bug(e)


def _reports_for_the_job(e: UserError) -> bool:
    """Whether this process prints a user error. Under `accelerate launch`/torchrun every rank parses the
    same flags and files, so an error raised before the process group exists (config, launch checks) is
    the same on every rank, and so is an `EveryRankError` after it (the run directory): only rank 0 prints it,
    the others exit quietly with the same code. Otherwise, an error may be one rank's own: every rank prints."""
    if os.environ.get("RANK", "0") == "0" or not os.environ["RANK"].isdigit():  # rank 0, or no rank to defer to
        return True
    if isinstance(e, EveryRankError):
        return False
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _let_rank_0_fail_first() -> None:
    """Under a launcher (torchrun sets LOCAL_RANK), wait before the quiet exit: torchrun stops the whole job at
    the first exit, which would cut off a rank 0 a little behind this one before it prints the line. Its
    SIGTERM then ends this rank silently (the default action, not the trainer's handler)."""
    if os.environ.get("LOCAL_RANK") is None:
        return
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(QUIET_RANK_EXIT_S)


def _path_error_line(e: OSError) -> str | None:
    """One line for an OSError that a path the user chose explains (errors.path_error_line), a full disk under
    TensorBoard's folder naming that folder and --use_tensorboard false; None: a bug."""
    tb_dir = tensorboard_logdir(e) if e.errno in DISK_FULL else None
    if tb_dir:
        return (f"error: disk full writing TensorBoard events to {tb_dir}: {e.strerror}; free space, choose another "
                "--output_dir or --use_tensorboard false, then --resume latest")
    return path_error_line(e)


# what gloo and NCCL say when a collective's peer process is gone (killed, e.g. by the out-of-memory killer, or crashed)
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "remote process exited")


def _peer_lost_line(e: BaseException) -> str | None:
    """One line for a collective that failed because another process of the job is gone: this process has no bug
    to report, and the launcher's output names the process that failed and why. None: not that."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    if not any(marker in str(e) for marker in PEER_LOST):
        return None
    said = re.sub(r"^\[[^\]]*\]\s*", "", first_line(e)).split(". ")[0][:160]  # gloo's "[pair.cc:537] Read error..."
    return (f"error: rank {dist.get_rank()} of {dist.get_world_size()}: another process of the job is gone ({said}); "
            "the launcher's output on that process's node says which and why (SIGKILL: often the out-of-memory "
            "killer); the same command with --resume latest continues from the last checkpoint")


def _bug(e: BaseException) -> int:
    import traceback

    traceback.print_exc(file=sys.stderr)
    line = " ".join(str(e).split())[:300]
    return _fail(f"error: internal error {type(e).__name__}: {line} (a bug in yxanul or a library: please report "
                 "it with the traceback above)", EXIT_BUG)


def _fail(line: str, code: int) -> int:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    return code


def _detach_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _exit_watchdog(code: int) -> None:
    """A daemon timer that hard-exits with ``code`` if the normal exit (joining threads, atexit
    handlers, DataLoader workers) has not finished after ``EXIT_GRACE_S``."""
    import threading

    def hard_exit():
        try:
            sys.stderr.write(f"exit took more than {EXIT_GRACE_S:.0f}s: forcing it\n")
            sys.stderr.flush()
        finally:
            os._exit(code)

    t = threading.Timer(EXIT_GRACE_S, hard_exit)
    t.daemon = True
    t.start()


def _print_or_pipe_closed(text: str, code: int) -> int:
    """`yxanul --help | head -1`: the reader may close the pipe before we write; exit as `cmd | head` does
    (141, nothing on stderr), with stdout pointed at /dev/null so the interpreter's final flush stays quiet
    (the recipe of Python's signal docs, "Note on SIGPIPE")."""
    try:
        print(text, flush=True)
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    """The `yxanul` entry point. ``argv`` None: this process's own command line, and the process exits
    with the returned code (so the exit watchdog is armed on errors)."""
    process_exit = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        return _print_or_pipe_closed(_usage(), 0 if argv else 2)
    if argv[0] in ("-V", "--version"):
        return _print_or_pipe_closed(f"yxanul {__version__}", 0)
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command '{name}' (expected one of: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    return run(getattr(importlib.import_module(module), func), rest, process_exit=process_exit)


if __name__ == "__main__":
    sys.exit(main())
