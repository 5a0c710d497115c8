"""The training loop: config → data → model → precision/accelerator → steps → checkpoints/trackers.

`Trainer` keeps the run's progress in ``self.state`` (a :class:`TrainState`, what a resume restores,
whole) and its batch plan in ``self.batch`` (the current stage's: micro-batch, accumulation, tokens per
step); `fit()` is the loop and calls small methods: `setup()`, `resume()`, `advance()`, `log()`,
`evaluate()`, `save()`, `enter_stage()`. `train(cfg)` is the entry point (`yxanul train`). Features plug
in through callbacks (:mod:`yxanul.training.callbacks`), not by editing the loop.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from ..checkpoint import left_behind, load_for_resume, prepare_run_dir, resolve_resume, save_checkpoint
from ..data.loader import repeats_warning
from ..errors import TrainingDiverged, alike_on_every_rank
from ..models.build import build_model, describe, model_config
from ..models.modeling_yxanul import resolve_backend
from ..precision import probe_facts, resolve_precision
from ..precision.master_weights import model_params_in_groups
from ..run_lock import lock_on_main
from ..tracking import MetricsLog, format_eval_line, format_step_line, mfu, peak_flops, progress
from . import fsdp, provenance, speed_defaults
from .batching import plan_curriculum, resolve_batch, torch_reduce_min
from .callbacks import CallbackList, from_config
from .evaluation import evaluate_loss, sample
from .guards import CollapseGuard, check_val_loss
from .launch import check_process_env, preflight
from .loaders import prepared_data, train_loader, val_batches, warn_lost_tokens
from .optim import build_optimizer
from .preemption import StopRequest
from .reporting import PrecisionReport, resume_warnings, resumed_line, run_summary, start_trackers, write_summary
from .runtime import StepTimer, UnwrapCache, build_accelerator, compile_model, process_state, quiet, weights_sharded
from .schedule import lr_at, schedule_of
from .state import RunInfo, TrainState, read_state_file, state_file_dict
from .step import StepOutput, train_step

QUIET_S = 15.0  # between two logged steps, a progress line (step, %, ETA) once this long passed without one


class Trainer:
    """One training run of ``cfg`` (a :class:`yxanul.config.Config`). Every process builds one."""

    def __init__(self, cfg, callbacks=(), speed_table: dict | None = None):
        self.cfg = cfg
        self.speed_table = speed_table  # None: yxanul/assets/speed_defaults.yaml (training/speed_defaults.py)
        self.callbacks = CallbackList(callbacks)
        self.state = TrainState()
        self.timer = StepTimer()
        self.guard = CollapseGuard()  # a collapsed model stops like a diverged one
        self.first_loss = self.last_loss = self.tokens_per_sec = self.logged_at = None
        self.logged_steps = 0
        self.stage_idx: int | None = None
        self.train_iter = self.lock = None
        self.left_behind: set[str] = set()  # checkpoints past the one resumed: not among the newest keep_last
        self._unwrap = UnwrapCache()  # `unwrapped_model`
        self._trackers_started = False
        self.t_start = time.monotonic()  # durations: a wall clock may jump (NTP, a VM resumed)
        self.said_at = time.perf_counter()  # the last console line of the loop (progress lines fill long gaps)

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> Trainer:
        """Run dir, data, model, precision plan, batch plan, accelerator, optimizer, loaders."""
        from accelerate.utils import set_seed

        check_process_env()  # the launcher's WORLD_SIZE/RANK/MASTER_ADDR, before anything reads them
        say0 = print if os.environ.get("RANK", "0") == "0" else quiet
        cfg, line = speed_defaults.for_run(self.cfg, resolve_backend(self.cfg.model.backend), self.speed_table,
                                           facts=probe_facts())
        self.cfg = cfg
        self.schedule = schedule_of(cfg.to_flat_dict())  # lr_at's arguments, every step
        if line:
            say0(line)
        # what `accelerate launch` exported and a W&B key W&B would refuse: before any process group exists
        preflight(cfg, say=say0)
        self.callbacks.on_setup(self)  # e.g. a Hub push with no token: refused before the run directory exists
        self.cpu, self.dist = process_state()
        self.say = print if self.dist.is_main_process else quiet
        self.run_dir, cfg.checkpoint = prepare_run_dir(cfg, self.dist)  # refuses to train over other runs' work
        self.lock = lock_on_main(self.run_dir, self.dist)  # one writer per run directory (rank 0 holds it)
        self.run_name = cfg.checkpoint.run_name or self.run_dir.name
        set_seed(cfg.train.seed)
        with alike_on_every_rank():  # a refused resume is refused before its data is prepared, not after
            provenance.precheck(cfg, self.run_dir)
        self.data_dir, self.vocab_size, self.tokenizer = prepared_data(cfg, self.dist, self.say)
        self.trained_on = provenance.record(cfg, self.data_dir, self.tokenizer)  # checked on resume, saved each step
        model = self._setup_model()
        self._setup_accelerator(model)
        self._setup_loaders()
        return self

    def _setup_model(self):
        """The model, the precision plan (applied to it) and the batch plan(s), before the Accelerator."""
        cfg, world = self.cfg, self.dist.num_processes
        config = model_config(cfg.model, self.vocab_size)
        self.plan = resolve_precision(cfg.precision, config, say=self.say)
        with self.plan.weight_init():  # fp8_weight_all_gather: TE layers built with FP8 weights
            model = build_model(cfg.model, self.vocab_size, config)
        self.mcfg = model.config
        self.plan.prepare_model(model, say=self.say)  # small-GEMM policy, read-back hooks: the probe sees them too
        finder = dict(model=model, plan=self.plan, run_dir=self.run_dir,
                      write_cache=(self.dist.is_main_process, self.dist.is_local_main_process),
                      reduce_min=torch_reduce_min() if world > 1 else None)
        with alike_on_every_rank():  # the config and the world size: every rank finds the same mistake
            self.batch = resolve_batch(cfg.batch, seq_length=cfg.model.seq_length, world_size=world, say=self.say,
                                       **finder)
            self.curriculum, self.stage_plans = plan_curriculum(cfg, self.batch, self.batch.tokens_per_step, world,
                                                                self.say, **finder)
        return model

    def _setup_accelerator(self, model) -> None:
        cfg = self.cfg
        self.accelerator = acc = build_accelerator(cfg, self.plan, self.run_dir, self.batch, self.cpu, self.say,
                                                  model=model)
        if acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        model.to(acc.device)  # before the optimizer: AdamW takes its fused CUDA kernel only for CUDA params
        self.sharded = weights_sharded(acc) and acc.num_processes > 1
        self.plan.cache_fp8_weights = not weights_sharded(acc)
        if acc.is_fsdp2:  # sharded before the optimizer is built (training/fsdp.py)
            fp8 = self.plan.fp8_weights
            self.model, self.optimizer = fsdp.prepare(
                acc, model, functools.partial(build_optimizer, args=cfg.optim, fp8_weights=fp8),
                fsdp.fp32_values(model, cfg.model.init_from) if fp8 else None)
        else:
            optimizer = build_optimizer(model, cfg.optim)
            with model_params_in_groups(optimizer):  # accelerate's FP8 prepare maps the optimizer's params by name
                self.model, self.optimizer = acc.prepare(model, optimizer)
        self.plan.after_prepare(self.model)
        if cfg.train.torch_compile:
            self.model = compile_model(self.model, acc.device.type, self.plan.fp8_enabled)
        self.say(describe(self.mcfg))
        self.say(f"batch: {self.batch.line()}")
        if self.sharded and cfg.tracking.sample_tokens:
            self.say("samples: none during training (the weights are sharded over the processes; rank 0 cannot "
                     "generate alone): `yxanul generate` on an export")
        self.report = PrecisionReport(self.plan, self.run_dir, acc.is_main_process, self.say)
        self.report.build(self.unwrapped_model)

    def _setup_loaders(self) -> None:
        self.loader = train_loader(self.data_dir, self.cfg, self.cfg.model.seq_length, self.batch.micro_batch,
                                   self.batch.grad_accum, self.accelerator, curriculum=self.curriculum is not None)
        warn_lost_tokens(self.loader, self.say)
        if msg := repeats_warning(self.data_dir, self.cfg.train.max_steps, self.batch.tokens_per_step):
            self.say(msg)  # e.g. a mixture that ended early: the loader would loop over it
        self.val = val_batches(self.data_dir, self.cfg, self.batch.micro_batch, self.accelerator, self.say)
        self.val_sequences = len(self.val) * self.accelerator.num_processes * self.batch.micro_batch
        self.peak = peak_flops(torch.cuda.get_device_name() if torch.cuda.is_available() else None)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", enabled=self.accelerator.is_main_process)

    @property
    def unwrapped_model(self):
        return self._unwrap(self.accelerator, self.model)  # again only for another self.model

    # -- resume --------------------------------------------------------------------------------
    def resume(self) -> Path | None:
        """With ``--resume``: weights, optimizer, RNG, data position, FP8 scales and progress of the
        checkpoint; returns its path (None: nothing to resume)."""
        cfg = self.cfg
        ckpt = resolve_resume(cfg.checkpoint.resume, self.run_dir, say=self.say) if cfg.checkpoint.resume else None
        if cfg.checkpoint.resume and ckpt is None:  # only 'auto' gets here: 'latest' was refused in setup
            self.say(f"resume {cfg.checkpoint.resume}: no checkpoint under {self.run_dir}: starting a new run")
        if ckpt is None:
            return None
        saved, wrote = read_state_file(ckpt, type(self.state))
        with alike_on_every_rank():  # one checkpoint, one config: the same answer on every rank
            changed = provenance.check(ckpt, self.trained_on, cfg.checkpoint.resume_allow_changes, saved.data, self.say)
        load_for_resume(self.accelerator, ckpt, cfg)
        if "dataset" in changed:  # a position in other data means nothing: read the new data from its start
            saved.data = None
        self.state = saved  # whole: every field of TrainState is progress
        self.left_behind = left_behind(self.run_dir, saved.step) if self.accelerator.is_main_process else set()
        if saved.data is not None:
            self.loader.load_state_dict(saved.data)
        self.plan.restore_fp8_state(self.unwrapped_model, ckpt, cfg.model.seq_length)
        self.say(resumed_line(ckpt, saved.step, wrote, world_size=self.accelerator.num_processes,
                              tokens_per_step=self.batch.tokens_per_step,
                              precision="FP8" if self.plan.fp8_enabled else self.plan.label))
        for warning in resume_warnings(wrote, self.batch.tokens_per_step, cfg.batch, self.val_sequences,
                                       self.batch.micro_batch, ckpt, cfg.to_flat_dict(), saved.step):
            self.say(warning)
        return Path(ckpt)

    # -- one step ------------------------------------------------------------------------------
    def next_batches(self) -> list:
        """The micro-batches of the next optimizer step: as many as the current batch plan accumulates."""
        if self.train_iter is None:
            self.train_iter = iter(self.loader)
        return [next(self.train_iter) for _ in range(self.batch.grad_accum)]

    def advance(self, batches) -> StepOutput:
        """One optimizer step at the scheduled LR; advances ``state.step`` and ``state.tokens_seen``."""
        self.lr = lr_at(self.state.step, **self.schedule)
        out = train_step(self.model, self.optimizer, batches, plan=self.plan, accelerator=self.accelerator,
                         max_grad_norm=self.cfg.optim.max_grad_norm, lr=self.lr)
        self.state.step += 1
        self.state.tokens_seen += self.batch.tokens_per_step
        self.timer.steps += 1
        if not self._trackers_started:  # after the first step: the run config carries TE's FP8 read-back
            t0 = time.perf_counter()
            self.state.wandb_run_id = start_trackers(self.accelerator, self.cfg, self.run_dir, self.run_name,
                                                     self.unwrapped_model, self.plan, self.state.wandb_run_id,
                                                     self.say, first_step=self.state.step)
            self._trackers_started = True
            self.timer.exclude(time.perf_counter() - t0)  # W&B's start is not step time
        return out

    # -- logging -------------------------------------------------------------------------------
    def _mean(self, total) -> float | None:
        return None if total is None else self.accelerator.reduce(total / self.batch.grad_accum, "mean").item()

    def log(self, out: StepOutput) -> dict[str, Any]:
        """Console line + metrics.jsonl + trackers (the only device sync of a training step)."""
        st, acc = self.state, self.accelerator
        loss = self._mean(out.loss)
        # lm_loss/penalty apart only when a penalty is configured: the default console line stays as it was
        penalized = getattr(self.mcfg, "penalty_type", "none") != "none"
        lm_loss, penalty = (self._mean(out.lm_loss), self._mean(out.penalty)) if penalized else (None, None)
        norm = float(out.grad_norm) if out.grad_norm is not None else float("nan")
        dt = self.timer.lap()
        self.tokens_per_sec = self.batch.tokens_per_step / dt
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.last_loss, self.logged_steps, self.logged_at = loss, self.logged_steps + 1, st.step
        row = {"step": st.step, "epoch": self.loader.last_epoch, "loss": loss, "lr": self.lr, "grad_norm": norm,
               "dt_ms": dt * 1e3, "tokens_per_sec": self.tokens_per_sec, "precision": self.plan.label,
               "tokens_seen": st.tokens_seen, "seq_length": self.loader.seq_length}
        if lm_loss is not None:
            row.update(lm_loss=lm_loss, penalty=penalty)
        if self.curriculum is not None:
            row["stage"] = self.stage_idx
        if self.peak:
            row["mfu"] = self.mfu()
        if self.plan.fp8_enabled and self.cfg.precision.fp8_stats:
            row.update({f"fp8/{k}": v for k, v in self.plan.fp8_stats(self.unwrapped_model).items()})
        self.report.refresh(self.unwrapped_model)
        self.say(format_step_line(st.step, self.loader.last_epoch, loss, self.lr, norm, dt * 1e3, self.tokens_per_sec,
                                  self.plan.label, lm_loss=lm_loss, penalty=penalty,
                                  max_steps=self.cfg.train.max_steps), flush=True)
        self.said_at = time.perf_counter()
        self.metrics.write(row)
        ppl = math.exp(min(loss if lm_loss is None else lm_loss, 50))  # the LM's: a penalty term is no perplexity
        acc.log({f"train/{k}": v for k, v in row.items() if isinstance(v, (int, float))} | {"train/ppl": ppl},
                step=st.step)
        if not (math.isfinite(loss) and (out.grad_norm is None or math.isfinite(norm))):
            raise TrainingDiverged(f"step {st.step}: loss {loss}, gradient norm {norm}: stopping "
                                   "(lower max_lr, or check the data)")
        self.guard.observe(st.step, out.grad_norm if out.grad_norm is None else norm)
        return row

    def mfu(self) -> float | None:
        """MFU of the last logged throughput at the current stage's seq_length (None: unknown peak)."""
        if not self.tokens_per_sec:
            return None
        return mfu(self.mcfg.flops_per_token(self.loader.seq_length), self.tokens_per_sec, self.peak,
                   self.accelerator.num_processes)

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        """Validation LM loss/perplexity on fixed batches, a generated sample, callbacks' metrics."""
        t0 = time.perf_counter()
        st, acc, tr = self.state, self.accelerator, self.cfg.tracking
        val_loss = evaluate_loss(self.model, self.val, self.plan, acc)
        check_val_loss(st.step, val_loss, self.run_dir)  # NaN would reach sampling's multinomial
        st.record_eval(val_loss)
        row = {"step": st.step, "val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50)),
               "tokens_seen": st.tokens_seen}
        extra = {k.removeprefix("eval/"): v for k, v in self.callbacks.on_evaluate(self).items()}
        row.update(extra)
        msg = format_eval_line(st.step, val_loss, row["val_ppl"], self.mfu() if self.peak else None,
                               self.peak and self.peak[0], extra)
        if acc.is_main_process and tr.sample_tokens and not self.sharded:  # rank 0 alone can't run sharded weights
            row["sample"] = sample(self.unwrapped_model, self.tokenizer, tr.sample_prompt, tr.sample_tokens,
                                   acc.device)
            with open(self.run_dir / "samples.txt", "a") as f:
                f.write(f"--- step {st.step}\n{row['sample']}\n")
            msg += f"\nsample: {row['sample']!r}"
        self.say(msg, flush=True)
        self.metrics.write(row)
        shown = {f"eval/{k}": v for k, v in extra.items()} | ({"eval/sample": row["sample"]} if "sample" in row else {})
        acc.log({"eval/val_loss": val_loss, "eval/val_ppl": row["val_ppl"], **shown}, step=st.step)  # str: as text
        self.timer.exclude(time.perf_counter() - t0)  # eval time is not step time
        return row

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, out: StepOutput) -> Path:
        """A checkpoint of this step (never of a diverged model); callbacks' ``on_save`` after it."""
        t0 = time.perf_counter()
        st, acc = self.state, self.accelerator
        finite = bool(torch.isfinite(acc.reduce(out.loss.detach(), "sum")))  # one sync per checkpoint
        self.guard.before_save(st.step, out.grad_norm, loss_finite=finite, run_dir=self.run_dir)
        st.epoch, st.data = self.loader.last_epoch, self.loader.state_dict()  # the step's epoch; the next batch's place
        info = RunInfo(precision=self.plan.label, backend=self.mcfg.backend, world_size=acc.num_processes,
                       tokens_per_step=self.batch.tokens_per_step, val_sequences=self.val_sequences,
                       **self.plan.metadata())
        state = state_file_dict(st, info)
        ckpt = save_checkpoint(acc, self.run_dir, state, keep_last=self.cfg.checkpoint.keep_last,
                               config_yaml=yaml.safe_dump(self.cfg.to_flat_dict(), sort_keys=False),
                               extra=functools.partial(self._save_extra, self.unwrapped_model),
                               left_behind=self.left_behind)
        self.left_behind.discard(str(ckpt))  # saved again by this run: one of its own now
        is_best = state["val_loss"] is not None and state["val_loss"] == st.best_val_loss
        self.callbacks.on_save(self, Path(ckpt), is_best)
        self.timer.exclude(time.perf_counter() - t0)  # save time is not step time
        return Path(ckpt)

    def _save_extra(self, model, ckpt_dir) -> None:
        """Written into a checkpoint before its manifest: the FP8 scaling state, what it was trained on."""
        self.plan.save_fp8_state(model, ckpt_dir)
        provenance.write(Path(ckpt_dir), self.trained_on)

    # -- curriculum ----------------------------------------------------------------------------
    def stage_changed(self) -> bool:
        return self.curriculum is not None and self.curriculum.stage_at(self.state.step)[0] != self.stage_idx

    def enter_stage(self) -> None:
        """Curriculum: at a stage boundary, switch seq length, micro-batch, accumulation and loader."""
        # the data goes on where the previous stage (or the checkpoint) left it: same position for the
        # same seq_length, else the next epoch (another window grid); never back to epoch 0
        prev = self.loader.state_dict() if self.stage_idx is not None else self.state.data
        self.stage_idx, stage = self.curriculum.stage_at(self.state.step)
        self.batch = bp = self.stage_plans[self.stage_idx]
        self.accelerator.gradient_accumulation_steps = bp.grad_accum  # accelerate's loss scale follows the plan
        self.loader = train_loader(self.data_dir, self.cfg, stage.seq_length, bp.micro_batch, bp.grad_accum,
                                   self.accelerator, True)
        if prev:
            self.loader.load_state_dict(prev)
        self.train_iter = iter(self.loader)
        self.say(f"curriculum stage {self.stage_idx}: seq_length {stage.seq_length}, micro {bp.micro_batch} x "
                 f"accumulation {bp.grad_accum} x world {bp.world_size} = {bp.tokens_per_step:,} tokens per step, "
                 f"until step {stage.end_step or self.cfg.train.max_steps}")

    # -- the loop ------------------------------------------------------------------------------
    def _due(self, every: int, is_last: bool) -> bool:
        return bool(every and self.state.step % every == 0) or is_last

    def fit(self) -> dict[str, Any]:
        """Train from ``state.step`` to ``max_steps`` (call `setup()` and `resume()` first)."""
        cfg, st = self.cfg, self.state
        if self.accelerator.is_main_process:  # after the resume's checks: a refused resume leaves the run's config
            cfg.save(self.run_dir / "config.yaml")
        self.report.write()
        todo, past = cfg.train.max_steps - st.step, f" (the checkpoint is past max_steps {cfg.train.max_steps})"
        self.say(f"training {max(0, todo)} steps from step {st.step} into {self.run_dir}{past if todo < 0 else ''}")
        self.model.train()
        self.callbacks.on_train_begin(self)
        self.timer = StepTimer()
        self.said_at = time.perf_counter()
        with StopRequest() as stop:
            while st.step < cfg.train.max_steps:
                if self.stage_changed():
                    self.enter_stage()
                out = self.advance(self.next_batches())
                is_last = st.step == cfg.train.max_steps
                if self._due(cfg.tracking.log_freq, is_last) or st.step == 1:  # step 1: the initial loss (~ln V)
                    self.log(out)
                elif time.perf_counter() - self.said_at > QUIET_S:  # no sync: the step timer only
                    self.say(progress(st.step, cfg.train.max_steps, self.timer.peek()), flush=True)
                    self.said_at = time.perf_counter()
                if self._due(cfg.tracking.eval_freq, is_last):
                    self.evaluate()
                stopping = stop.poll(self.accelerator)
                if stopping or self._due(cfg.checkpoint.checkpoint_freq, is_last and cfg.checkpoint.save_final):
                    self.save(out)
                if stopping:
                    got = signal.Signals(stop.signum).name if stop.signum else "a stop signal on another rank"
                    self.say(f"received {got}: checkpoint saved at step {st.step}, exiting")
                    break
            return self.finish()

    def finish(self) -> dict[str, Any]:
        """Close the metrics and trackers; the run's summary (also ``summary.json``)."""
        self.metrics.close()
        self.callbacks.on_train_end(self)
        self.accelerator.end_training()
        summary = run_summary(self.state, self.first_loss, self.last_loss, self.plan.label,
                              time.monotonic() - self.t_start, self.run_dir, self.logged_steps, self.logged_at)
        if self.accelerator.is_main_process:
            write_summary(summary, self.run_dir, self.say, max_steps=self.cfg.train.max_steps)
        if self.lock is not None:
            self.lock.release()  # the run's last write is done
        return summary


def train(cfg, callbacks=None, speed_table: dict | None = None) -> dict[str, Any]:
    """Train according to ``cfg`` (a :class:`yxanul.config.Config`); returns a summary dict.
    ``callbacks``: None = the ones the config asks for (:func:`~yxanul.training.callbacks.from_config`).
    ``speed_table``: the speed defaults (None: the shipped table, `yxanul.training.speed_defaults`)."""
    trainer = Trainer(cfg, from_config(cfg) if callbacks is None else callbacks, speed_table)
    try:
        trainer.setup()
        trainer.resume()
        return trainer.fit()
    finally:
        if trainer.lock is not None:  # a process's end releases it too; in-process callers train again
            trainer.lock.release(remove_unused=True)  # a run refused before it wrote anything leaves no folder
