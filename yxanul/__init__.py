"""yxanul: FP8 LLM pretraining on the Hugging Face stack."""

__version__ = "0.1.0"
