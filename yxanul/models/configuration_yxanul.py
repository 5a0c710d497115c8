"""`YxanulConfig`: a Llama-style decoder (RMSNorm, SwiGLU, RoPE, GQA, no biases) and its presets.

Written in transformers 5's dataclass style (fields + ``__post_init__``), like ``LlamaConfig``.
Shape errors raise :class:`yxanul.errors.ConfigError` (one line, exit code 2 from the CLI).
"""

from __future__ import annotations

import importlib
import sys
from types import MappingProxyType
from typing import Literal

from transformers.configuration_utils import PreTrainedConfig

from ..errors import ConfigError
from .args import NORM_KERNELS, validate_loss
from .presets import BACKENDS, PRESETS, VOCAB_MULTIPLE  # noqa: F401  (re-exported; the shapes live in a torch-free module)

# the model classes' module, named as transformers' auto mappings name theirs: it imports this one
MODELING = "yxanul.models.modeling_yxanul"


def pad_vocab(n: int, multiple: int = 64) -> int:
    """Round a tokenizer's vocabulary up to a multiple of ``multiple`` (tensor-core / FP8 friendly)."""
    if n < 1 or multiple < 1:
        raise ConfigError("vocab_size", "a positive integer", n)
    return -(-n // multiple) * multiple


class YxanulConfig(PreTrainedConfig):
    r"""Configuration of :class:`~yxanul.models.YxanulForCausalLM`.

    ``backend``: ``"torch"`` (plain PyTorch, runs anywhere; the default), ``"te"`` (Transformer Engine
    blocks) or ``"auto"`` (``te`` when TE imports and CUDA is present). Building a model replaces ``"auto"`` by
    the backend actually used, so ``save_pretrained``/``from_pretrained`` round-trips it; pass
    ``backend="torch"`` to ``from_pretrained`` to load a TE-trained model on a machine without TE.
    """

    model_type = "yxanul"
    # transformers' Trainer: what evaluate/predict leave out of the predictions (the logits alone, as Llama's)
    keys_to_ignore_at_inference = ["past_key_values", "lm_loss", "penalty"]
    # No remote code: the classes come from `import yxanul` (yxanul/_register.py). An empty, read-only,
    # unsaved class attribute: TRL's create_model_from_path reads `config.auto_map` for any architecture
    # that is not in transformers and then picks AutoModelForCausalLM.
    auto_map = MappingProxyType({})

    vocab_size: int = 8192
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None     # None = num_attention_heads (plain multi-head)
    intermediate_size: int = 704
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True
    backend: Literal["auto", "te", "torch"] = "torch"  # ModelArgs (the CLI) defaults to "auto"
    # The training loss (yxanul/models/loss.py): in the config so the HF model applies it under Trainer too.
    penalty_type: Literal["none", "z_loss", "max_z_loss"] = "none"
    penalty_weight: float = 0.0
    loss_impl: Literal["default", "chunked", "te"] = "default"
    fuse_qkv_params: bool = False  # TE backend: one fused QKV weight (state-dict names unchanged)
    fuse_qkv_rope: bool = False  # TE backend: that weight grouped per KV head, q/k RoPE in one kernel (modeling_te.py)
    rope_kernel: Literal["te", "triton"] = "te"  # fuse_qkv_rope's kernel: TE's or models/rope_triton.py
    norm_kernel: Literal["te", "cudnn"] = "te"  # TE backend: TE's RMSNorm kernels or cuDNN's (modeling_te.py)
    cuda_graphs: bool = False  # TE backend on CUDA: each block replayed as a CUDA graph (models/cuda_graphs.py)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    # as LlamaConfig's: generate() reads it (a KV cache or none); `from_pretrained(..., use_cache=False)` and
    # TRL's model_init_kwargs set it. A forward called without use_cache keeps no cache either way (training).
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        self.validate_shapes()
        super().__post_init__(**kwargs)
        if MODELING not in sys.modules:  # AutoModel*: every lookup comes with a config instance, so now
            importlib.import_module(MODELING)  # which registers the model classes

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def flops_per_token(self, seq_length: int | None = None) -> float:
        """Training FLOPs per token at ``seq_length`` (default ``max_position_embeddings``): 6·N for the
        matmuls (N = :func:`matmul_parameters`: the layers' linears and the LM head; the embedding
        lookup is no matmul) plus 12·L·C·T for attention's QK^T and AV (PaLM, appendix B). The one
        formula behind every MFU yxanul prints (trainer: the curriculum stage's seq_length; bench).
        transformers' ``floating_point_ops`` has no attention term, hence this."""
        T = self.max_position_embeddings if seq_length is None else seq_length
        return 6 * matmul_parameters(self) + 12 * self.num_hidden_layers * self.hidden_size * T

    def validate_shapes(self) -> None:
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "intermediate_size", "max_position_embeddings"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(key, "a positive integer", v)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("hidden_size", f"a multiple of num_attention_heads={self.num_attention_heads}",
                              self.hidden_size)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_key_value_heads", f"a divisor of num_attention_heads={self.num_attention_heads}",
                              self.num_key_value_heads)
        if self.head_dim % 2:
            raise ConfigError("hidden_size", "hidden_size/num_attention_heads even (RoPE rotates pairs)",
                              self.hidden_size)
        if self.backend not in BACKENDS:
            raise ConfigError("backend", "one of " + ", ".join(BACKENDS), self.backend)
        validate_loss(self.penalty_type, self.penalty_weight, self.loss_impl)
        if self.norm_kernel not in NORM_KERNELS:
            raise ConfigError("norm_kernel", "one of " + ", ".join(NORM_KERNELS), self.norm_kernel)


def _register() -> None:
    from transformers.models.auto.configuration_auto import AutoConfig

    AutoConfig.register("yxanul", YxanulConfig, exist_ok=True)


_register()


def config_from_preset(name: str, vocab_size: int, seq_length: int, **overrides) -> YxanulConfig:
    """The config of preset ``name`` for a tokenizer of ``vocab_size`` tokens (padded to a multiple of
    64, or the preset's ``VOCAB_MULTIPLE``) and sequences of up to ``seq_length`` tokens.
    ``overrides``: any YxanulConfig field (None = keep)."""
    if name not in PRESETS:
        raise ConfigError("model", "one of " + ", ".join(PRESETS), name)
    if isinstance(seq_length, bool) or not isinstance(seq_length, int) or seq_length < 1:
        raise ConfigError("seq_length", "a positive integer", seq_length)
    kw = dict(PRESETS[name], vocab_size=pad_vocab(vocab_size, VOCAB_MULTIPLE.get(name, 64)),
              max_position_embeddings=seq_length)
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return YxanulConfig(**kw)


def count_parameters(config: YxanulConfig) -> int:
    """Exact parameter count of ``YxanulForCausalLM(config)`` (tied embeddings counted once)."""
    h, L = config.hidden_size, config.num_hidden_layers
    untied_head = 0 if config.tie_word_embeddings else config.vocab_size * h
    return matmul_parameters(config) + untied_head + L * 2 * h + h  # + 2 norms per layer + final norm


def matmul_parameters(config: YxanulConfig) -> int:
    """Parameters taking part in a matmul per token (the layers' linears + LM head): the N of 6N."""
    h, f, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * config.head_dim
    return L * (2 * h * h + 2 * h * kv + 3 * f * h) + config.vocab_size * h
