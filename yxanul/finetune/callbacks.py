"""A TrainerCallback for the TRL stages of `yxanul grpo` (kept apart: importing transformers is slow)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import TrainerCallback


class MetricsLog(TrainerCallback):
    """Appends every log row (with its stage and step) to metrics.jsonl as it comes, so a stopped run keeps
    the curve it had."""

    def __init__(self, path: Path, stage: str):
        self.path, self.stage = Path(path), stage

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"stage": self.stage, "step": state.global_step, **logs}) + "\n")
