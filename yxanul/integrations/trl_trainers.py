"""TRL's trainers with yxanul's precision plan: ``YxanulTrainer`` in front of TRL's class in the MRO, so
TRL keeps its data handling and loss while the plan (FP8 on the TE backend: ``te.autocast`` around the
forwards, the recipe, FP8 weight caching, TE's scaling state in checkpoints; docs/trainer.md) wraps it.

    model = AutoModelForCausalLM.from_pretrained(native_export, backend="te", dtype=torch.bfloat16)
    trainer = YxanulSFTTrainer(model=model, args=SFTConfig(..., bf16=True), train_dataset=ds,
                               precision=PrecisionArgs(use_fp8=True))

GRPO: rollouts go through ``generate()``, which on a TE model runs the torch twin (same weights, BF16);
the policy's loss forward runs the TE blocks under the plan, left padding as TE's "arbitrary" mask.
GRPO calls the model itself (not with the batch dict), so it gets no ``is_first_microbatch``: TE
re-quantizes the weights at every forward, correct and a little slower.
"""

from __future__ import annotations

from trl import GRPOTrainer, SFTTrainer

from .hf_trainer import YxanulTrainer


class YxanulSFTTrainer(YxanulTrainer, SFTTrainer):
    """``trl.SFTTrainer`` + ``precision=PrecisionArgs(...)`` (a model instance, not a path: the plan
    prepares that model before TRL sees it)."""


class YxanulGRPOTrainer(YxanulTrainer, GRPOTrainer):
    """``trl.GRPOTrainer`` + ``precision=PrecisionArgs(...)`` (a model instance, not a path)."""
