"""accelerate's optimizer wrapper, passed by where it provably does nothing but the torch calls inside it.

Written here although accelerate does it, for the time its generality costs every optimizer step (measured on
CPU, nano; the commits quote them): ``AcceleratedOptimizer.step`` asks ``is_lomo_available()`` twice (an uncached
``importlib`` search of sys.path, ~55 us) and its ``zero_grad`` runs ``inspect.signature`` (~7 us). What the wrapper
does besides the inner call (accelerate 1.15, accelerate/optimizer.py), and why a *plain* setup — one process, DDP
on GPUs or on CPUs, no fp16 grad scaler, no parallelism config — needs none of it:

- ``step``: an XLA gradient all-reduce (XLA only); no step for a LOMO optimizer (yxanul builds none: refused
  below); steps only ``if gradient_state.sync_gradients`` (kept: read on every call); with a grad scaler, the
  scaler's step and the ``_accelerate_step_called``/``_is_overflow`` bookkeeping that ``step_was_skipped`` and
  a prepared LR scheduler read. Without a scaler ``_is_overflow`` stays False and ``_accelerate_step_called`` does
  not exist, and yxanul prepares no scheduler (it sets each group's lr itself, `Trainer.advance`).
- ``zero_grad``: only ``if sync_gradients``, with ``set_to_none`` when the inner ``zero_grad`` takes it (the
  direct path requires that it does).

The gradient clip stays accelerate's (`step._clip`). DeepSpeed (``DeepSpeedOptimizerWrapper``, another class),
FSDP/FSDP2, XLA, fp16 and anything else keep the wrapper. The decisions are made once per optimizer / accelerator
(what they read is fixed once prepared)."""

from __future__ import annotations

import inspect

_PLAIN_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU")  # accelerate's DistributedType values with nothing in the wrappers
_ACCELERATOR_KEY = "_yxanul_plain"  # on the Accelerator: plain(accelerator), decided once
_OPTIMIZER_KEY = "_yxanul_direct"  # on accelerate's AcceleratedOptimizer: the optimizer inside it to call, or False


def plain(accelerator) -> bool:
    """Whether accelerate's optimizer wrapper adds nothing to the torch calls inside it here."""
    got = vars(accelerator).get(_ACCELERATOR_KEY)
    if got is None:
        got = (getattr(accelerator.distributed_type, "value", None) in _PLAIN_TYPES
               and accelerator.scaler is None
               and not (accelerator.native_amp and accelerator.mixed_precision == "fp16")
               and accelerator.parallelism_config is None)
        vars(accelerator)[_ACCELERATOR_KEY] = got
    return got


def _inner_if_plain(optimizer, accelerator):
    from accelerate.optimizer import AcceleratedOptimizer

    if type(optimizer) is not AcceleratedOptimizer or optimizer.scaler is not None or not plain(accelerator):
        return None  # DeepSpeed's wrapper is a subclass: kept
    inner = optimizer.optimizer
    if type(inner).__module__.partition(".")[0] == "lomo_optim":  # the wrapper never steps these
        return None
    if "set_to_none" not in inspect.signature(inner.zero_grad).parameters:
        return None
    return inner


def direct_optimizer(optimizer, accelerator):
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` when calling its ``step``/``zero_grad``
    directly is what the wrapper does (see the module's doc), else None."""
    if accelerator is None:
        return None
    got = vars(optimizer).get(_OPTIMIZER_KEY)
    if got is None:
        got = vars(optimizer)[_OPTIMIZER_KEY] = _inner_if_plain(optimizer, accelerator) or False
    return got or None


def optimizer_step(optimizer, accelerator) -> None:
    """``optimizer.step()`` then ``optimizer.zero_grad(set_to_none=True)``, past accelerate's wrapper when plain."""
    inner = direct_optimizer(optimizer, accelerator)
    if inner is None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elif optimizer.gradient_state.sync_gradients:  # the wrapper steps and zeroes only then
        inner.step()
        inner.zero_grad(set_to_none=True)
