"""Fine-tuning after pretraining with TRL: `yxanul grpo` (GRPO, optional SFT first) on multiple-choice QA."""
