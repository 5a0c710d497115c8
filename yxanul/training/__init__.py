"""Training: `TrainState` (state.py), the one training step (step.py), the LR schedule and the
curriculum (schedule.py), validation and samples (evaluation.py), callbacks (callbacks.py), the
`Trainer` and `train(cfg)` (trainer.py) with its helpers: the Accelerator and the step timer
(runtime.py), the data it reads (loaders.py), what it reports (reporting.py); `TrainArgs` (args.py)."""

from .._lazy import lazy_exports

_WHERE = {
    "TrainArgs": "args", "Callback": "callbacks", "CallbackList": "callbacks", "from_config": "callbacks",
    "evaluate_loss": "evaluation",
    "Curriculum": "schedule", "Stage": "schedule", "lr_at": "schedule", "same_tokens_micro": "schedule",
    "TrainState": "state", "StepOutput": "step", "forward": "step", "train_step": "step",
    "Trainer": "trainer", "train": "trainer",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
