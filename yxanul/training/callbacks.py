"""The trainer's callback protocol: features that react to training (push to the Hub, evaluation
tasks, sweeps) plug in here instead of editing the loop.

A callback is any object with some of these methods (all optional; every process calls them, so
guard main-process-only work with ``trainer.accelerator.is_main_process``)::

    on_setup(trainer) -> None                       # first in setup(), after the launch checks, before the run
                                                    # directory exists: refuse what cannot work (only ``cfg``)
    on_train_begin(trainer) -> None                 # after setup() and resume(), before step 1
    on_evaluate(trainer) -> dict[str, float] | None # after the validation loss; extra metrics, logged
                                                    # as eval/<name> in metrics.jsonl and the trackers
    on_save(trainer, ckpt_dir: Path, is_best: bool) -> None  # after a checkpoint is committed
    on_train_end(trainer) -> None                   # after the last step, before trackers close

What a callback may read: ``trainer.cfg`` (the resolved Config), ``trainer.state`` (a
:class:`~yxanul.training.state.TrainState`: step, tokens_seen, val_loss, best_val_loss, ...),
``trainer.model`` (``trainer.unwrapped_model`` for ``save_pretrained``), ``trainer.tokenizer``,
``trainer.accelerator``, ``trainer.run_dir``, ``trainer.plan``. A callback must not change them.
Pass callbacks as ``Trainer(cfg, callbacks=[...])`` or ``train(cfg, callbacks=[...])``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..evaluation.tasks import EvalTasksCallback
from ..hub.background import HubPushCallback


@runtime_checkable
class Callback(Protocol):
    """Documentation of the protocol; subclassing it is optional (only the methods used must exist)."""

    def on_setup(self, trainer) -> None: ...

    def on_train_begin(self, trainer) -> None: ...

    def on_evaluate(self, trainer) -> dict[str, float] | None: ...

    def on_save(self, trainer, ckpt_dir: Path, is_best: bool) -> None: ...

    def on_train_end(self, trainer) -> None: ...


class CallbackList:
    """Calls each callback's method if it has one, in order."""

    def __init__(self, callbacks=()):
        self.callbacks = list(callbacks)

    def _call(self, name: str, *args) -> list[Any]:
        return [getattr(cb, name)(*args) for cb in self.callbacks if hasattr(cb, name)]

    def on_setup(self, trainer) -> None:
        self._call("on_setup", trainer)

    def on_train_begin(self, trainer) -> None:
        self._call("on_train_begin", trainer)

    def on_evaluate(self, trainer) -> dict[str, float]:
        extra: dict[str, float] = {}
        for metrics in self._call("on_evaluate", trainer):
            extra.update(metrics or {})
        return extra

    def on_save(self, trainer, ckpt_dir: Path, is_best: bool) -> None:
        self._call("on_save", trainer, ckpt_dir, is_best)

    def on_train_end(self, trainer) -> None:
        self._call("on_train_end", trainer)


class MainProcessOnly:
    """Runs a callback on the main process only (exports, uploads, benchmark tasks); the others
    get nothing back from ``on_evaluate``."""

    def __init__(self, callback):
        self.callback = callback

    def _main(self, trainer) -> bool:
        return trainer.accelerator.is_main_process

    def on_setup(self, trainer) -> None:
        if os.environ.get("RANK", "0") == "0" and hasattr(self.callback, "on_setup"):  # no accelerator yet
            self.callback.on_setup(trainer)

    def on_train_begin(self, trainer) -> None:
        if self._main(trainer) and hasattr(self.callback, "on_train_begin"):
            self.callback.on_train_begin(trainer)

    def on_evaluate(self, trainer) -> dict[str, float]:
        if self._main(trainer) and hasattr(self.callback, "on_evaluate"):
            return self.callback.on_evaluate(trainer) or {}
        return {}

    def on_save(self, trainer, ckpt_dir: Path, is_best: bool) -> None:
        if self._main(trainer) and hasattr(self.callback, "on_save"):
            self.callback.on_save(trainer, ckpt_dir, is_best)

    def on_train_end(self, trainer) -> None:
        if self._main(trainer) and hasattr(self.callback, "on_train_end"):
            self.callback.on_train_end(trainer)


def from_config(cfg) -> list:
    """The callbacks a config asks for: evaluation tasks at each evaluation (``--eval_tasks``) and Hub
    pushes of saved checkpoints (``--push_to_hub``), both on the main process."""
    callbacks: list = []
    hub, tasks = getattr(cfg, "hub", None), getattr(cfg, "tasks", None)
    if tasks is not None and tasks.eval_tasks:
        callbacks.append(MainProcessOnly(EvalTasksCallback(tasks)))
    if hub is not None and hub.push_to_hub:
        callbacks.append(MainProcessOnly(HubPushCallback(hub, run_dir=None)))
    return callbacks
