"""Shared by the tests of yxanul/checkpoint: a trainer state to save and three saved checkpoints."""

import torch

from yxanul.checkpoint import save_checkpoint


def _state(step, val=None):
    return {"step": step, "tokens_seen": step * 100, "data": {"position": step}, "val_loss": val,
            "precision": "FP32", "backend": "torch"}


def _three(tmp_path, acc_model):
    acc, model, _ = acc_model
    for step in (1, 2, 3):
        with torch.no_grad():
            model.weight.add_(1.0)
        save_checkpoint(acc, tmp_path, _state(step), keep_last=5)
    return tmp_path / "checkpoints"
