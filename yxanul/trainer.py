"""The training loop: config → data → model → precision/accelerator → steps → checkpoints/trackers."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from .checkpoint import load_for_resume, prepare_run_dir, read_state, resolve_resume, save_checkpoint
from .errors import TrainingDiverged, UserError
from .guards import CollapseGuard, check_val_loss
from .optim import build_optimizer, lr_at
from .preemption import StopRequest
from .tracking import (MetricsLog, flat_tracker_config, flops_per_token, format_step_line, peak_flops,
                       tracker_names)


def _curriculum(cfg, batch, tokens_per_step: int, world_size: int, say, *, model=None, plan=None, run_dir=None,
                reduce_min=None, write_cache: bool = True):
    """Stages and a batch plan per stage keeping tokens per optimizer step constant. With
    ``auto_batch_size`` each stage's micro-batch is searched (and cached) at its own seq_length;
    otherwise (or on CPU) it keeps the base plan's tokens per micro-batch."""
    if not cfg.batch.curriculum:
        return None, None
    from .batch_finder import find_micro, micro_multiple
    from .curriculum import Curriculum, same_tokens_micro

    cur = Curriculum.from_config(cfg.batch.curriculum, tokens_per_step, max_seq_length=cfg.model.seq_length)
    same_tokens = same_tokens_micro(batch.micro_batch, cfg.model.seq_length)
    align = plan.token_alignment if plan is not None else 1

    def micro_for(seq_length: int) -> int:
        if cfg.batch.auto_batch_size and model is not None:
            micro, found = find_micro(cfg.batch, model=model, plan=plan, seq_length=seq_length, world_size=world_size,
                                      run_dir=run_dir, say=say, reduce_min=reduce_min,
                                      write_cache=write_cache)
            if found is not None:
                return micro
        return same_tokens(seq_length)

    plans = cur.plan_stages(micro_for, world_size, multiple=lambda T: micro_multiple(cfg.batch, T, align))
    for i, bp in enumerate(plans):
        if bp.warning:
            say(f"warning: curriculum stage {i}: {bp.warning}")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and len({p.grad_accum for p in plans}) > 1:
        raise UserError("curriculum: stages need different gradient accumulation, which DeepSpeed fixes at start; "
                        "choose micro_batch_size/target_tokens_per_step so accumulation is the same in every stage")
    return cur, plans


def _configure_deepspeed(accelerator, cfg, micro: int, accum: int, say) -> None:
    """Under DeepSpeed: drop keys that only cost time (lint policy) and fill what accelerate would
    take from a prepared DataLoader (yxanul's loader is not prepared) or fill wrongly
    (``gradient_clipping: auto`` becomes 1.0 in accelerate, not ``max_grad_norm``)."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    from .lint import sanitize_deepspeed_config

    ds, warnings = sanitize_deepspeed_config(plugin.deepspeed_config)
    for w in warnings:
        say(f"warning: {w.line()} (removed for this run)")
    ds.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum,
              train_batch_size=micro * accum * accelerator.num_processes,
              gradient_clipping=cfg.optim.max_grad_norm)
    plugin.deepspeed_config.clear()
    plugin.deepspeed_config.update(ds)


def _evaluate(model, batches, plan, accelerator) -> float:
    model.eval()
    total = torch.zeros((), device=accelerator.device)
    n = 0
    with torch.no_grad(), plan.forward_context(training=False):
        for x, y in batches:
            out = model(x.to(accelerator.device), shift_labels=y.to(accelerator.device), return_logits=False)
            total += out.loss.float()
            n += 1
    model.train()
    return accelerator.reduce(total / max(n, 1), "mean").item()


def _sample(model, tokenizer, prompt: str, n_tokens: int, device) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    if ids.numel() == 0:
        ids = torch.tensor([[tokenizer.eos_token_id]], device=device)
    was_training = model.training
    model.eval()  # no training-only branches (checkpointing, TE's weight caching) while sampling
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # keep resume exact
        torch.manual_seed(0)
        out = model.generate(ids, max_new_tokens=n_tokens, do_sample=True, top_k=50, temperature=0.8,
                             pad_token_id=tokenizer.eos_token_id)
    model.train(was_training)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def train(cfg) -> dict[str, Any]:
    """Train according to ``cfg`` (a :class:`yxanul.config.Config`); returns a summary dict."""
    from accelerate import Accelerator, PartialState
    from accelerate.utils import ProjectConfiguration, set_seed

    from .batch_finder import resolve_batch, torch_reduce_min
    from .data.loader import WindowLoader, eval_batches, split_window
    from .data.prepare import ensure_prepared, load_prepared_tokenizer
    from .models.args import build_model, describe
    from .models.configuration_yxanul import count_parameters
    from .precision import format_report, precision_report, resolve_precision

    t_start = time.time()
    # On a CPU-only machine tell accelerate so (else torchrun'd ranks each become 'rank 0 of 1'),
    # except under DeepSpeed, which accelerate disables when cpu=True.
    cpu = not torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true"
    state = PartialState(cpu=cpu)
    say = print if state.is_main_process else (lambda *a, **k: None)
    run_dir = prepare_run_dir(cfg)  # refuses to train over another run's checkpoints (launch checks: cli.py)
    set_seed(cfg.train.seed)

    # -- data ------------------------------------------------------------------------------------
    data_dir = ensure_prepared(cfg.data, is_main_process=state.is_local_main_process,  # one per node
                               wait=state.wait_for_everyone, say=say)
    meta = json.loads((Path(data_dir) / "meta.json").read_text())
    tokenizer = load_prepared_tokenizer(data_dir)

    # -- model, precision, batch ------------------------------------------------------------------
    model = build_model(cfg.model, vocab_size=meta["vocab_size"])
    mcfg = model.config
    plan = resolve_precision(cfg.precision, mcfg, say=say)
    plan.prepare_model(model, say=say)  # small-GEMM policy, read-back hooks: the batch probe sees them too
    finder = dict(model=model, plan=plan, run_dir=run_dir, write_cache=state.is_main_process,
                  reduce_min=torch_reduce_min() if state.num_processes > 1 else None)
    batch = resolve_batch(cfg.batch, seq_length=cfg.model.seq_length, world_size=state.num_processes, say=say, **finder)
    accum = batch.grad_accum
    tokens_per_step = batch.micro_batch * accum * state.num_processes * cfg.model.seq_length
    curriculum, stage_plans = _curriculum(cfg, batch, tokens_per_step, state.num_processes, say, **finder)
    accelerator = Accelerator(
        **plan.accelerator_kwargs(), gradient_accumulation_steps=accum,
        log_with=tracker_names(cfg.tracking, run_dir) or None,
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "tensorboard")),
        step_scheduler_with_optimizer=False, cpu=cpu,
    )
    _configure_deepspeed(accelerator, cfg, batch.micro_batch, accum, say)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg.save(run_dir / "config.yaml")
    optimizer = build_optimizer(model, cfg.optim)
    model, optimizer = accelerator.prepare(model, optimizer)
    plan.after_prepare(model)
    if cfg.train.torch_compile:
        model = torch.compile(model)
    n_params = count_parameters(mcfg)
    say(describe(mcfg))
    say(f"batch: micro {batch.micro_batch} x accumulation {accum} x world {accelerator.num_processes} "
        f"= {batch.micro_batch * accum * accelerator.num_processes} sequences x {cfg.model.seq_length} "
        f"= {tokens_per_step:,} tokens per optimizer step")
    report = precision_report(accelerator.unwrap_model(model), plan)
    say(format_report(report))

    def make_loader(seq_length: int, micro: int) -> WindowLoader:  # curriculum stages share one chunk order
        return WindowLoader(data_dir, "train", seq_length, micro, seed=cfg.train.seed,
                            base_length=cfg.model.seq_length if curriculum is not None else None,
                            rank=accelerator.process_index, world_size=accelerator.num_processes,
                            num_workers=cfg.data.num_workers, pin_memory=accelerator.device.type == "cuda",
                            packed=True)

    loader, stage_idx, resumed_data = make_loader(cfg.model.seq_length, batch.micro_batch), None, None
    if loader.windows.lost_fraction > 0.02:
        say(f"warning: {loader.windows.lost_fraction:.0%} of the training tokens are shard tails shorter than a "
            f"window (windows never cross shards): prepare with a larger shard_size_tokens")
    val = list(eval_batches(data_dir, cfg.model.seq_length, batch.micro_batch, cfg.tracking.eval_steps,
                            rank=accelerator.process_index, world_size=accelerator.num_processes))
    step, best_val, val_loss, val_step, tokens_seen = 0, math.inf, None, None, 0
    if cfg.checkpoint.resume:
        ckpt = resolve_resume(cfg.checkpoint.resume, run_dir, say=say)
        if ckpt is None:
            say(f"resume: no checkpoint under {run_dir}, starting from scratch")
        else:
            load_for_resume(accelerator, ckpt, cfg)
            st = read_state(ckpt)
            step, val_loss, val_step = st["step"], st.get("val_loss"), st["step"]
            tokens_seen = st.get("tokens_seen", step * tokens_per_step)
            loader.load_state_dict(st["data"])
            resumed_data = st["data"]
            plan.restore_fp8_state(accelerator.unwrap_model(model), ckpt, cfg.model.seq_length)
            changes = [f"{k}: {st[k]} -> {v}" for k, v in (("world_size", accelerator.num_processes),
                       ("tokens_per_step", tokens_per_step),
                       ("precision", "FP8" if plan.fp8_enabled else plan.label)) if k in st and st[k] != v]
            say(f"resumed from {ckpt} at step {step}" + (f" ({'; '.join(changes)})" if changes else ""))

    if accelerator.is_main_process:
        (run_dir / "precision_report.json").write_text(json.dumps(report, indent=2, default=str))
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=accelerator.is_main_process)
    peak = peak_flops(torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    fpt = flops_per_token(n_params, mcfg.num_hidden_layers, mcfg.hidden_size, cfg.model.seq_length)
    stop, guard = StopRequest(), CollapseGuard()
    decay_steps = cfg.optim.lr_decay_steps or cfg.train.max_steps
    clip = cfg.optim.max_grad_norm or float("inf")
    first_loss = last_loss = None

    def start_trackers() -> float:
        """After this process's first step, so that the run config (TensorBoard hparams, W&B config)
        carries the precision report with TE's read-back. Returns the seconds it took."""
        t0 = time.perf_counter()
        rep = precision_report(accelerator.unwrap_model(model), plan)
        accelerator.init_trackers(cfg.tracking.wandb_project if cfg.tracking.use_wandb else cfg.checkpoint.run_name,
                                  init_kwargs={"wandb": {"name": cfg.checkpoint.run_name, "dir": str(run_dir)}},
                                  config=flat_tracker_config({**cfg.to_flat_dict(), "precision_report": rep}))
        return time.perf_counter() - t0

    def checkpoint_state() -> dict[str, Any]:
        return {"step": step, "tokens_seen": tokens_seen, "epoch": loader.epoch, "data": loader.state_dict(),
                "val_loss": val_loss if val_step == step else None, "precision": plan.label, "backend": mcfg.backend,
                "world_size": accelerator.num_processes, "tokens_per_step": tokens_per_step,
                **plan.metadata()}

    def save():
        finite = torch.isfinite(accelerator.reduce(loss_sum.detach(), "sum"))  # one sync per checkpoint
        if norm is not None:
            finite &= torch.isfinite(torch.as_tensor(norm, device=finite.device))
        if not bool(finite):
            raise TrainingDiverged(f"step {step}: loss or gradient norm is not finite; no checkpoint written "
                                   f"over the good ones in {run_dir / 'checkpoints'} (lower max_lr, or check the data)")
        guard.before_save(step, norm)
        save_checkpoint(accelerator, run_dir, checkpoint_state(), keep_last=cfg.checkpoint.keep_last,
                        config_yaml=yaml.safe_dump(cfg.to_flat_dict(), sort_keys=False),
                        extra=lambda d: plan.save_fp8_state(accelerator.unwrap_model(model), d))

    def enter_stage():
        """Curriculum: at a stage boundary, switch seq length, micro-batch, accumulation and loader."""
        nonlocal stage_idx, accum, loader, train_iter, resumed_data, tokens_per_step
        # the data goes on where the previous stage (or the checkpoint) left it: same position for the
        # same seq_length, else the next epoch (another window grid); never back to epoch 0
        prev = resumed_data or (loader.state_dict() if stage_idx is not None else None)
        stage_idx, stage = curriculum.stage_at(step)
        bp = stage_plans[stage_idx]
        accum = accelerator.gradient_accumulation_steps = bp.grad_accum
        loader = make_loader(stage.seq_length, bp.micro_batch)
        if prev:
            loader.load_state_dict(prev)
        resumed_data, tokens_per_step = None, bp.tokens_per_step
        train_iter = iter(loader)
        say(f"curriculum stage {stage_idx}: seq_length {stage.seq_length}, micro {bp.micro_batch} x accumulation "
            f"{bp.grad_accum} x world {bp.world_size} = {bp.tokens_per_step:,} tokens per step, "
            f"until step {stage.end_step or cfg.train.max_steps}")

    def log_step(loss_sum, norm, lr) -> None:
        """Console line + metrics.jsonl + trackers (the only device sync of a training step)."""
        nonlocal first_loss, last_loss, tps, report, t_log, steps_since_log
        loss_val = accelerator.reduce(loss_sum / accum, "mean").item()
        norm_val = float(norm) if norm is not None else float("nan")
        dt = (time.perf_counter() - t_log) / steps_since_log
        tps = tokens_per_step / dt
        first_loss = loss_val if first_loss is None else first_loss
        last_loss = loss_val
        row = {"step": step, "epoch": loader.epoch, "loss": loss_val, "lr": lr, "grad_norm": norm_val,
               "dt_ms": dt * 1e3, "tokens_per_sec": tps, "precision": plan.label, "tokens_seen": tokens_seen,
               "seq_length": loader.seq_length}
        if curriculum is not None:
            row["stage"] = stage_idx
        if peak:
            row["mfu"] = fpt * tps / (peak[1] * accelerator.num_processes)
        if plan.fp8_enabled and cfg.precision.fp8_stats:
            row.update({f"fp8/{k}": v for k, v in plan.fp8_stats(accelerator.unwrap_model(model)).items()})
        if plan.fp8_enabled and report.get("te_readback") is None and plan.readback is not None:
            report = precision_report(accelerator.unwrap_model(model), plan)  # now with TE's read-back
            say(format_report(report))
            if accelerator.is_main_process:
                (run_dir / "precision_report.json").write_text(json.dumps(report, indent=2, default=str))
        say(format_step_line(step, loader.epoch, loss_val, lr, norm_val, dt * 1e3, tps, plan.label), flush=True)
        metrics.write(row)
        accelerator.log({f"train/{k}": v for k, v in row.items() if isinstance(v, (int, float))}, step=step)
        if not (math.isfinite(loss_val) and (norm is None or math.isfinite(norm_val))):
            raise TrainingDiverged(f"step {step}: loss {loss_val}, gradient norm {norm_val}: stopping "
                                   "(lower max_lr, or check the data)")
        guard.observe(step, norm_val)
        t_log, steps_since_log = time.perf_counter(), 0

    def evaluate() -> None:
        """Validation loss/perplexity on fixed batches and a generated sample."""
        nonlocal val_loss, val_step, best_val, t_log
        t0 = time.perf_counter()
        val_loss, val_step = _evaluate(model, val, plan, accelerator), step
        check_val_loss(step, val_loss, run_dir)
        row = {"step": step, "val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50)), "tokens_seen": tokens_seen}
        msg = f"eval step {step:4d} | val_loss: {val_loss:.6f} | val_ppl: {row['val_ppl']:.2f}"
        if peak and tps:
            msg += f" | mfu: {fpt * tps / (peak[1] * accelerator.num_processes):.1%} of {peak[0]} BF16 dense peak"
        if accelerator.is_main_process and cfg.tracking.sample_tokens:
            row["sample"] = _sample(accelerator.unwrap_model(model), tokenizer, cfg.tracking.sample_prompt,
                                    cfg.tracking.sample_tokens, accelerator.device)
            with open(run_dir / "samples.txt", "a") as f:
                f.write(f"--- step {step}\n{row['sample']}\n")
            msg += f"\nsample: {row['sample']!r}"
        say(msg, flush=True)
        metrics.write(row)
        accelerator.log({"eval/val_loss": val_loss, "eval/val_ppl": row["val_ppl"]}, step=step)
        best_val = min(best_val, val_loss)
        t_log += time.perf_counter() - t0  # eval time is not step time

    say(f"training {cfg.train.max_steps - step} steps from step {step} into {run_dir}")
    train_iter = iter(loader)
    model.train()
    t_log, steps_since_log, norm, tps, trackers_started = time.perf_counter(), 0, None, None, False
    while step < cfg.train.max_steps:
        if curriculum is not None and curriculum.stage_at(step)[0] != stage_idx:
            enter_stage()
        lr = lr_at(step, max_lr=cfg.optim.max_lr, min_lr_ratio=cfg.optim.min_lr_ratio,
                   warmup_steps=cfg.optim.warmup_steps, decay_steps=decay_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=accelerator.device)
        accelerator.step = 0  # accelerate syncs at (its micro counter % accum == 0): count from this step
        for micro in range(accum):  # one optimizer step
            x, y = split_window(next(train_iter), accelerator.device)  # (B, T) each
            with accelerator.accumulate(model):
                with plan.forward_context(training=True):
                    loss = model(x, shift_labels=y, is_first_microbatch=plan.is_first_microbatch(micro),
                                 return_logits=False).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norm = accelerator.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
        step, steps_since_log, tokens_seen = step + 1, steps_since_log + 1, tokens_seen + tokens_per_step
        if not trackers_started:
            t_log, trackers_started = t_log + start_trackers(), True  # W&B's start is not step time

        is_last = step == cfg.train.max_steps
        if step % cfg.tracking.log_freq == 0 or is_last or step == 1:  # step 1: the initial loss (~ln V)
            log_step(loss_sum, norm, lr)
        if (cfg.tracking.eval_freq and step % cfg.tracking.eval_freq == 0) or is_last:
            evaluate()
        stopping = stop.poll(accelerator)
        if stopping or (cfg.checkpoint.checkpoint_freq and step % cfg.checkpoint.checkpoint_freq == 0) \
                or (is_last and cfg.checkpoint.save_final):
            t0 = time.perf_counter()
            save()
            t_log += time.perf_counter() - t0  # save time is not step time
        if stopping:
            got = signal.Signals(stop.signum).name if stop.signum else "a stop signal on another rank"
            say(f"received {got}: checkpoint saved at step {step}, exiting")
            break

    metrics.close()
    accelerator.end_training()
    summary = {"steps": step, "tokens_seen": tokens_seen, "first_loss": first_loss, "last_loss": last_loss,
               "val_loss": val_loss, "best_val_loss": best_val if best_val < math.inf else None,
               "precision": plan.label, "wall_time_s": time.time() - t_start, "run_dir": str(run_dir)}
    if accelerator.is_main_process:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        say(f"done: {step} steps, {tokens_seen:,} tokens in {summary['wall_time_s']:.1f}s; "
            f"loss {first_loss} -> {last_loss}; val_loss {val_loss}")
    return summary
