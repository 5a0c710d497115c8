"""Integrations with the wider HF stack: yxanul's precision plan under `transformers.Trainer` (docs/trainer.md).

    from yxanul.integrations import YxanulTrainer, PrecisionCallback, precision_args_from_env
    trainer = YxanulTrainer(model=model, args=TrainingArguments(...), train_dataset=ds,
                            precision=PrecisionArgs(use_fp8=True, fp8_margin=1, fp8_amax_history_len=16))

TRL: ``YxanulSFTTrainer`` / ``YxanulGRPOTrainer`` (trl_trainers.py), the same plan in front of TRL's trainers.
"""

from .._lazy import lazy_exports

_WHERE = {"YxanulTrainer": "hf_trainer", "precision_args_from_env": "hf_trainer",
          "PrecisionCallback": "callback", "flat_numbers": "callback",
          "YxanulSFTTrainer": "trl_trainers", "YxanulGRPOTrainer": "trl_trainers"}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
