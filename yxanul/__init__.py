"""yxanul: FP8 LLM pretraining on the Hugging Face stack.

Importing it registers model type "yxanul" with transformers' AutoConfig / AutoModel /
AutoModelForCausalLM (lazily, without importing transformers: ``yxanul._register``)."""

from ._register import install as _register_with_transformers

__version__ = "0.1.0"

_register_with_transformers()
