"""Console line, ``metrics.jsonl``, accelerate trackers (TensorBoard, W&B) and MFU."""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError


@dataclass
class TrackingArgs:
    """Logging, evaluation and experiment tracking."""

    log_freq: int = field(default=10, metadata={"help": "Print/log training metrics every N optimizer steps."})
    eval_freq: int = field(default=250,
                           metadata={"help": "Evaluate on the validation split (and print a sample) every N steps "
                                             "(0: only at the end)."})
    eval_steps: int = field(default=20, metadata={"help": "Validation batches per evaluation, all processes "
                                                        "together (rounded down to a multiple of their number, at "
                                                        "least one each)."})
    use_tensorboard: bool = field(default=True, metadata={"help": "Write TensorBoard event files under output_dir."})
    use_wandb: bool = field(default=False,
                            metadata={"help": "Log to Weights & Biases (offline mode when no API key is configured)."})
    wandb_project: str = field(default="yxanul", metadata={"help": "W&B project."})
    wandb_entity: str | None = field(default=None, metadata={"help": "W&B entity (team or user)."})
    sample_tokens: int = field(default=48,
                               metadata={"help": "Tokens generated for the sample printed at each evaluation "
                                                 "(0: none); fewer where prompt and sample would pass the model's "
                                                 "seq_length positions."})
    sample_prompt: str = field(default="\n", metadata={"help": "Prompt of the generated sample."})

    def __post_init__(self):
        for key in ("log_freq", "eval_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(key, "an integer >= 1", getattr(self, key))
        for key in ("eval_freq", "sample_tokens"):
            if getattr(self, key) < 0:
                raise ConfigError(key, "an integer >= 0", getattr(self, key))


# Dense (no sparsity) BF16 tensor-core peaks, FLOP/s. MFU is always reported against BF16.
PEAK_BF16_FLOPS = {
    "H100 SXM": 989e12, "H100 NVL": 835e12, "H100 PCIe": 756e12, "H100": 989e12, "H200 NVL": 835e12, "H200": 989e12,
    "GH200": 989e12, "B200": 2250e12, "B100": 1750e12, "A100": 312e12, "L40S": 362e12,
    "L40": 181e12, "L4": 121e12, "RTX 4090": 165e12, "A10G": 70e12,
}


def peak_flops(device_name: str | None) -> tuple[str, float] | None:
    if not device_name:
        return None
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key.replace(" ", "").lower() in device_name.replace(" ", "").lower():
            return key, PEAK_BF16_FLOPS[key]
    return None


def mfu(flops_per_token: float, tokens_per_sec: float, peak: tuple[str, float] | None, world_size: int) -> float | None:
    """Model FLOPs utilisation against the dense BF16 peak of ``world_size`` devices (None: unknown peak).
    FLOPs per token come from the model config (:meth:`YxanulConfig.flops_per_token`)."""
    if not peak:
        return None
    return flops_per_token * tokens_per_sec / (peak[1] * world_size)


def format_step_line(step: int, epoch: int, loss: float, lr: float, norm: float, dt_ms: float,
                     tok_per_sec: float, precision: str, lm_loss: float | None = None,
                     penalty: float | None = None, max_steps: int | None = None) -> str:
    """The console line users grep; its shape is fixed (``lm_loss``/``penalty`` follow ``loss`` only
    when the model has a penalty). With ``max_steps`` the first field is the progress,
    ``step  250/300 83% eta 39s``, the ETA from ``dt_ms`` (the mean step time since the last line)."""
    parts = f"loss: {loss:.6f} | "
    if lm_loss is not None:
        parts += f"lm_loss: {lm_loss:.6f} | penalty: {penalty if penalty is not None else float('nan'):.6f} | "
    return (f"{progress(step, max_steps, dt_ms / 1e3)} | epoch {epoch} | {parts}lr: {lr:.2e} | norm: {norm:.4f} | "
            f"dt: {dt_ms:.2f}ms | tok/sec: {tok_per_sec:.2f} | {precision}")


def format_eval_line(step: int, val_loss: float, val_ppl: float, mfu_value: float | None = None,
                     peak_name: str | None = None, extra: dict | None = None) -> str:
    """The evaluation's console line; float metrics of callbacks (``extra``) follow the perplexity."""
    line = f"eval step {step:4d} | val_loss: {val_loss:.6f} | val_ppl: {val_ppl:.2f}"
    if mfu_value is not None:
        line += f" | mfu: {mfu_value:.1%} of {peak_name} BF16 dense peak"
    return line + "".join(f" | {k}: {v:.4f}" for k, v in (extra or {}).items() if isinstance(v, float))


def progress(step: int, max_steps: int | None, sec_per_step: float | None) -> str:
    """``step  250/300 83% eta 39s`` (``step  250`` without ``max_steps``)."""
    if not max_steps:
        return f"step {step:4d}"
    known = sec_per_step is not None and math.isfinite(sec_per_step)  # a frozen clock gives nan
    eta = f" eta {format_duration((max_steps - step) * sec_per_step)}" if known else ""
    return f"step {step:4d}/{max_steps} {step / max_steps:.0%}{eta}"


def format_duration(seconds: float) -> str:
    """39s, 4m05s, 2h07m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class MetricsLog:
    """Append-only ``metrics.jsonl`` (one JSON object per line), written by the main process."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        self._f = open(self.path, "a", buffering=1) if enabled else None

    def write(self, row: dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (the tests, sweep summaries and notebooks read runs with it)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def tracker_names(args: TrackingArgs) -> list[str]:
    """accelerate ``log_with`` list (no side effects)."""
    return (["tensorboard"] if args.use_tensorboard else []) + (["wandb"] if args.use_wandb else [])


RUN_ID_FILE = "wandb_run_id"
INIT_TIMEOUT_S = 30.0


def wandb_run_id(run_dir: str | os.PathLike, resumed: str | None = None, environ=None) -> str:
    """The W&B run of this run directory: the environment's (``WANDB_RUN_ID``, set by a sweep agent or
    the user: a sweep trial stays in its sweep), else the one a resumed checkpoint names, else the one
    kept in ``RUN/wandb_run_id``, else a new id. A resume therefore continues the same W&B run."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_RUN_ID"):
        return environ["WANDB_RUN_ID"]
    if resumed:
        return resumed
    kept = Path(run_dir) / RUN_ID_FILE
    if kept.is_file() and kept.read_text().strip():
        return kept.read_text().strip()
    import uuid

    return uuid.uuid4().hex[:8]  # the shape of wandb.util.generate_id(), without importing wandb here


def tracker_init_kwargs(args: TrackingArgs, run_dir: str | os.PathLike, run_name: str, run_id: str | None,
                        environ=None, say=print) -> dict[str, dict[str, Any]]:
    """accelerate ``init_trackers(init_kwargs=...)``: the W&B settings passed to ``wandb.init`` (no
    ``WANDB_*`` environment writes). Offline unless an API key, a ``~/.netrc`` or ``WANDB_MODE`` says
    otherwise; files under the run directory; ``id`` + ``resume="allow"`` continue the run on resume."""
    if not args.use_wandb:
        return {}
    environ = os.environ if environ is None else environ
    kw: dict[str, Any] = {"name": run_name, "dir": environ.get("WANDB_DIR") or str(run_dir), "id": run_id,
                          "resume": "allow"}
    if args.wandb_entity:
        kw["entity"] = args.wandb_entity
    has_key = bool(environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").is_file()
    if not has_key and not environ.get("WANDB_MODE"):
        kw["mode"] = "offline"
        say("W&B: no API key found, logging offline (sync later with `wandb sync`)", flush=True)
    elif not environ.get("WANDB_INIT_TIMEOUT"):
        import wandb

        # a server that accepts and never answers: give up after 30 s (wandb's default is 90), then offline
        kw["settings"] = wandb.Settings(init_timeout=INIT_TIMEOUT_S)
    return {"wandb": kw}


def flat_tracker_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """accelerate's init_trackers takes scalars only (TensorBoard hparams, W&B config): nested dicts
    become ``a/b`` keys, lists JSON strings."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_tracker_config(v, key + "/"))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else v
    return out


# TensorBoard's SummaryWriter writes its event file from a daemon thread (tensorboard's
# `event_file_writer._AsyncWriterThread`). An OSError there (a full disk) ends that thread and is raised
# again in the main thread at the writer's next write/flush -- accelerate's TensorBoardTracker flushes
# after every `log`, so at the very next log. The thread's own traceback is noise on top of that.
_TB_THREAD = ("tensorboard.summary.writer.event_file_writer", "_AsyncWriterThread")


@contextlib.contextmanager
def quiet_tensorboard_writer_thread():
    """Inside: a `threading.excepthook` that drops an OSError ending TensorBoard's writer thread (the main
    thread raises it next and reports it as one line, see :func:`tensorboard_logdir`); every other thread
    exception goes to the previous hook, which is put back on exit."""
    previous = threading.excepthook

    def hook(args):
        cls = type(args.thread) if args.thread is not None else None
        if cls is not None and (cls.__module__, cls.__name__) == _TB_THREAD and issubclass(args.exc_type, OSError):
            return
        previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


def tensorboard_logdir(exc: BaseException) -> str | None:
    """The directory of the TensorBoard event file whose write raised ``exc`` (None: not TensorBoard's).
    Read from the traceback: tensorboard's `EventFileWriter` (``get_logdir()``) or its file (``filename``)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_globals.get("__name__", "").startswith("tensorboard."):
            obj = frame.f_locals.get("self")
            if callable(getattr(obj, "get_logdir", None)):
                return str(obj.get_logdir())
            if isinstance(getattr(obj, "filename", None), str):
                return os.path.dirname(obj.filename)
        tb = tb.tb_next
    return None
