"""`YxanulTrainer`: `transformers.Trainer` with yxanul's `PrecisionPlan`, so FP8 is really on (or off, saying why).

Why a subclass. `Trainer.create_accelerator_and_postprocess` builds its own `Accelerator` from
`TrainingArguments.mixed_precision` (the bf16/fp16 flags or ACCELERATE_MIXED_PRECISION) and passes
only its DDP kwargs handler (`_build_accelerator_args`): a `TERecipeKwargs` never reaches accelerate,
so under `accelerate launch --mixed_precision fp8` TE runs its default recipe, or nothing, and nobody
says which (LLaMA-Factory#9500). Here the plan decides BEFORE the Accelerator exists, exactly as in
`yxanul train` (precision/plan.py), and the subclass makes the decision true:

- `_build_accelerator_args` (the hook `create_accelerator_and_postprocess` calls): FP8 plan ->
  ``mixed_precision="fp8"`` + `TERecipeKwargs` with the configured values; impossible FP8 -> the plan's
  BF16/FP32 (one line saying why, or a one-line `UserError` with ``require_fp8``); no FP8 requested ->
  Trainer's own choice, untouched;
- the model gets `plan.prepare_model` (small-GEMM policy, TE read-back hooks, no pickled TE state)
  and, before its first forward, `plan.after_prepare` (accelerate's FP8 forward wrapper removed: it
  can only express DelayedScaling defaults and ignores the recipe under DeepSpeed);
- every forward runs under `plan.forward_context(training)` (`compute_loss_context_manager`): TE's
  autocast with the recipe built from every configured value, the only FP8 context, under single
  GPU, DDP and DeepSpeed alike; training forwards get `is_first_microbatch` (TE's FP8 weight cache
  across gradient-accumulation micro-batches);
- `PrecisionCallback` (callback.py) writes the precision report with TE's read-back and the FP8
  statistics; the delayed-scaling state travels with Trainer checkpoints (`fp8_state.safetensors`),
  restored on `resume_from_checkpoint` after the model is prepared, under DeepSpeed too.

Without FP8 requested it behaves exactly as `transformers.Trainer`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from transformers import Trainer

from .._deepspeed import import_deepspeed_quietly
from ..checkpoint import is_checkpoint_dir, verified_checkpoint
from ..errors import ConfigError
from ..lint.fsdp import launch_engine, train_conflicts
from ..precision import resolve_precision
from ..precision.args import PrecisionArgs
from ..precision.state import FILE
from .callback import ManifestCallback, PrecisionCallback

_ENV = "ACCELERATE_FP8_"


def precision_args_from_env(env=None, **overrides) -> PrecisionArgs:
    """`PrecisionArgs` from what `accelerate launch` exports (``mixed_precision: fp8`` and its
    ``fp8_config:`` as ACCELERATE_MIXED_PRECISION / ACCELERATE_FP8_*), so a launch config that asks for
    FP8 gets it under Trainer. Keyword ``overrides`` (PrecisionArgs fields) win. Bad values: ConfigError
    naming the variable."""
    env = os.environ if env is None else env
    kw: dict = {"use_fp8": env.get("ACCELERATE_MIXED_PRECISION", "no").lower() == "fp8"}
    ints = {"MARGIN": "fp8_margin", "AMAX_HISTORY_LEN": "fp8_amax_history_len"}
    for var, key in ints.items():
        if _ENV + var in env:
            try:
                kw[key] = int(env[_ENV + var])
            except ValueError:
                raise ConfigError(_ENV + var, "an integer", env[_ENV + var]) from None
    if _ENV + "FORMAT" in env:
        kw["fp8_format"] = env[_ENV + "FORMAT"].lower()
    if _ENV + "AMAX_COMPUTE_ALGO" in env:
        kw["fp8_amax_compute_algo"] = env[_ENV + "AMAX_COMPUTE_ALGO"].lower()
    if env.get(_ENV + "USE_AUTOCAST_DURING_EVAL", "").lower() in ("1", "true", "yes"):
        kw["fp8_eval"] = True
    if env.get(_ENV + "USE_MXFP8_BLOCK_SCALING", "").lower() in ("1", "true", "yes"):
        kw["fp8_recipe"] = "mxfp8"
    kw.update(overrides)
    for key, choices in (("fp8_format", ("hybrid", "e4m3", "e5m2")), ("fp8_amax_compute_algo", ("max", "most_recent"))):
        if kw.get(key, choices[0]) not in choices:
            raise ConfigError(key, " or ".join(choices), kw[key])
    return PrecisionArgs(**kw)


def _check_launch(model, args) -> None:
    """The model settings this Trainer's launch cannot run (`lint.fsdp.train_conflicts`, the rule of `yxanul
    train`): FSDP/DeepSpeed from the TrainingArguments or from `accelerate launch`'s environment."""
    engine = launch_engine(os.environ)
    fsdp, deepspeed = bool(args.fsdp) or engine == "fsdp2", bool(args.deepspeed) or engine == "deepspeed"
    train = {"fuse_qkv_rope": getattr(model.config, "fuse_qkv_rope", False)}
    for key, expected in train_conflicts(fsdp, train, deepspeed=deepspeed):
        raise ConfigError(key, expected, train[key])


class YxanulTrainer(Trainer):
    """`transformers.Trainer` + yxanul's precision plan. ``precision``: a `PrecisionArgs` (default: from
    the `accelerate launch` environment, `precision_args_from_env`); ``facts``: injected capability
    facts (tests), else probed. Everything else is `Trainer`'s."""

    def __init__(self, model=None, args=None, *, precision: PrecisionArgs | None = None, facts=None, **kwargs):
        if model is None or args is None:
            raise ConfigError("model/args", "a YxanulForCausalLM and TrainingArguments (model_init is not supported: "
                                            "the precision plan is made for one model)", "None")
        precision = precision if precision is not None else precision_args_from_env()
        if precision.use_fp8 and args.fp16:
            raise ConfigError("fp16", "False with use_fp8 (accelerate runs every non-FP8 layer in BF16: use bf16=True)",
                              True)
        if precision.master_weights != "none":  # Trainer's optimizer would step BF16 params whose grads go to masters
            raise ConfigError("master_weights", "none under transformers' Trainer (fp32 masters need yxanul's "
                                                "optimizer: yxanul train)", precision.master_weights)
        _check_launch(model, args)
        if precision.use_fp8 and args.bf16 and precision.mixed_precision == "auto":
            precision = dataclasses.replace(precision, mixed_precision="bf16")  # the fallback keeps the user's bf16
        main = args.process_index == 0
        self.plan = resolve_precision(precision, model.config, facts=facts, say=print if main else _quiet)
        self.plan.prepare_model(model, say=print if main else _quiet)
        self._yx_prepared: set[int] = set()
        self._yx_prev_sync, self._yx_first_micro = True, None
        import_deepspeed_quietly()  # before Trainer's accelerate imports it: no "Setting accelerator to CPU" line
        super().__init__(model=model, args=args, **kwargs)
        if args.label_names is None:
            self.label_names = _present_labels(self.train_dataset, self.eval_dataset)
        # first, so that the FP8 statistics it adds to a log reach every report_to logger after it
        self.callback_handler.callbacks.insert(0, PrecisionCallback(self.plan, say=print if main else _quiet,
                                                                     loggers=self.callback_handler.callbacks))
        self.add_callback(ManifestCallback())  # last: after every other on_save wrote into the checkpoint

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """Trainer's, with ``resume_from_checkpoint`` verified first (yxanul's `verified_checkpoint`): a
        damaged checkpoint named is one line; ``True`` takes the newest that verifies, saying what it skipped."""
        if resume_from_checkpoint:
            resume_from_checkpoint = verified_trainer_checkpoint(
                resume_from_checkpoint, self.args.output_dir, print if self.args.process_index == 0 else _quiet)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # -- the Accelerator -------------------------------------------------------------------------
    def _build_accelerator_args(self, **kwargs) -> dict:
        args = super()._build_accelerator_args(**kwargs)
        if not self.plan.args.use_fp8:
            return args  # nothing asked of yxanul: Trainer's own precision
        ours = self.plan.accelerator_kwargs()
        args["mixed_precision"] = ours["mixed_precision"]
        args["kwargs_handlers"] = list(args.get("kwargs_handlers") or []) + ours.get("kwargs_handlers", [])
        return args

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        got = str(self.accelerator.mixed_precision)
        if self.plan.fp8_enabled and got != "fp8":  # an AcceleratorState made earlier in this process won
            raise ConfigError("mixed_precision", "fp8 (the precision plan) but the process's accelerate state was "
                                                 "already initialised without it", got)

    # -- forwards ----------------------------------------------------------------------------------
    def compute_loss_context_manager(self):
        stack = super().compute_loss_context_manager()
        stack.enter_context(self.plan.forward_context(training=self.model.training))
        return stack

    def training_step(self, model, inputs, num_items_in_batch=None):
        # Trainer sets sync_gradients before each micro-batch (True on the last of an accumulation):
        # a micro-batch is the first of its optimizer step when the previous one synced.
        self._yx_first_micro = self._yx_prev_sync
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self._yx_prev_sync = bool(self.accelerator.sync_gradients)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if id(model) not in self._yx_prepared:  # after accelerate.prepare, before the first forward
            self.plan.after_prepare(model)
            self._yx_prepared.add(id(model))
        if self.plan.fp8_enabled and model.training and self._yx_first_micro is not None:
            inputs = {**inputs, "is_first_microbatch": self.plan.is_first_microbatch(0 if self._yx_first_micro else 1)}
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    # -- checkpoints: TE's delayed-scaling state, without pickle -----------------------------------
    def _load_optimizer_and_scheduler(self, checkpoint):
        # The one resume hook every transformers 5.x passes after the model is prepared AND its weights
        # are loaded: Trainer loads a plain model in `_load_from_checkpoint` before `prepare`, a DeepSpeed
        # one after it with DeepSpeed's own loader, then calls this (5.0 inline in `_inner_training_loop`,
        # 5.17/5.24 in `_prepare_for_training`). The FP8 scaling state is training state like these two.
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self._restore_fp8_state(self.model_wrapped, checkpoint)

    def _restore_fp8_state(self, wrapped, checkpoint: str) -> int:
        """``checkpoint/fp8_state.safetensors`` (PrecisionCallback.on_save) into the prepared model's TE
        modules; says what happened on the main process. Returns tensors restored."""
        path = os.path.join(checkpoint, FILE)
        if not os.path.isfile(path):
            return 0
        if id(wrapped) not in self._yx_prepared:  # accelerate's FP8 wrapper off before the allocating forward
            self.plan.after_prepare(wrapped)
            self._yx_prepared.add(id(wrapped))
        seq = min(64, getattr(self.model.config, "max_position_embeddings", 64))
        n = self.plan.restore_fp8_state(self.model, checkpoint, seq)  # the unwrapped model: the names it saved
        if self.args.process_index == 0:
            from safetensors import safe_open

            with safe_open(path, "pt") as f:
                total = len(list(f.keys()))
            unmatched = "no TE tensor of that name and shape (another recipe or fp8_amax_history_len?)"
            if n == total:
                print(f"restored {n} FP8 scaling tensors from {path}")
            elif n:
                print(f"restored only {n} of {total} FP8 scaling tensors from {path}: the others have {unmatched}")
            else:
                why = (f"FP8 is off in this run ({self.plan.fallback_reason or 'not requested'})"
                       if not self.plan.fp8_enabled else unmatched)
                print(f"{path} not restored: {why}")
        return n


def _quiet(*_a, **_k) -> None:
    pass


def _present_labels(*datasets) -> list[str]:
    """The label name a map-style dataset's first item has: ``shift_labels`` (`ShardWindowDataset`'s aligned
    targets, a keyword of the model's forward) or ``labels``; Trainer's evaluation computes a loss only when every
    batch has all its label names. ``labels`` when no item says (a collator adds them)."""
    for ds in datasets:
        ds = next(iter(ds.values()), None) if isinstance(ds, dict) else ds
        try:
            keys = set(ds[0].keys()) if ds is not None and len(ds) else set()
        except Exception:  # noqa: BLE001 - iterable or exotic datasets: the collator's labels
            continue
        present = [n for n in ("labels", "shift_labels") if n in keys]
        if present:
            return present
    return ["labels"]


def verified_trainer_checkpoint(resume, output_dir, say=print):
    """A Trainer ``resume_from_checkpoint`` (a ``checkpoint-N`` folder, a folder of them, or True: the
    output_dir's) -> the checkpoint folder to resume, verified by yxanul's `verified_checkpoint`
    against the manifest `ManifestCallback` wrote (a checkpoint without one gets the basic checks)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    p = Path(output_dir if resume is True else resume)
    if not p.is_dir():
        return resume  # Trainer's own error for a missing folder
    found = [d for d in p.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if d.is_dir() and d.name.rsplit("-", 1)[1].isdigit()]
    newest_first = None if is_checkpoint_dir(p) else sorted(found, key=lambda d: -int(d.name.rsplit("-", 1)[1]))
    if newest_first == []:
        return resume
    with verified_checkpoint(p, "resume_from_checkpoint", say, prefer=(), verb="resuming from",
                             candidates=newest_first, yxanul_state=False) as ckpt:
        return str(ckpt)
