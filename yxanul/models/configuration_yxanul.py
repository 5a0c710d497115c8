"""`YxanulConfig`: a Llama-style decoder (RMSNorm, SwiGLU, RoPE, GQA, no biases) and its presets."""

from __future__ import annotations

from transformers import PretrainedConfig

from ..errors import ConfigError

# name -> shape. Parameter counts (printed at start, tabulated in docs/models.md) are computed by
# count_parameters(); the "≈" sizes are the seed documents' names for them at vocab 50,304.
PRESETS: dict[str, dict] = {
    "tiny":        dict(num_hidden_layers=4,  hidden_size=256,  num_attention_heads=4,  num_key_value_heads=2,  intermediate_size=704),
    "gpt2-124m":   dict(num_hidden_layers=12, hidden_size=768,  num_attention_heads=12, num_key_value_heads=12, intermediate_size=2048),
    "small":       dict(num_hidden_layers=16, hidden_size=768,  num_attention_heads=12, num_key_value_heads=12, intermediate_size=2816),
    "medium":      dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, num_key_value_heads=16, intermediate_size=3072),
    "yxanul-0.6b": dict(num_hidden_layers=21, hidden_size=1536, num_attention_heads=12, num_key_value_heads=4,  intermediate_size=4096),
    "large":       dict(num_hidden_layers=24, hidden_size=1536, num_attention_heads=12, num_key_value_heads=12, intermediate_size=4096),
    "xlarge":      dict(num_hidden_layers=32, hidden_size=1920, num_attention_heads=15, num_key_value_heads=15, intermediate_size=4864),
}


def pad_vocab(n: int, multiple: int = 64) -> int:
    """Round a tokenizer's vocabulary up to a multiple of 64 (tensor-core / FP8 friendly)."""
    return ((n + multiple - 1) // multiple) * multiple


class YxanulConfig(PretrainedConfig):
    model_type = "yxanul"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, vocab_size: int = 8192, hidden_size: int = 256, num_hidden_layers: int = 4,
                 num_attention_heads: int = 4, num_key_value_heads: int | None = None,
                 intermediate_size: int = 704, max_position_embeddings: int = 2048,
                 rope_theta: float = 10000.0, rms_norm_eps: float = 1e-5, initializer_range: float = 0.02,
                 tie_word_embeddings: bool = True, backend: str = "torch", bos_token_id: int | None = None,
                 eos_token_id: int | None = None, pad_token_id: int | None = None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.backend = backend
        super().__init__(tie_word_embeddings=tie_word_embeddings, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, pad_token_id=pad_token_id, **kwargs)
        self.validate_shapes()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate_shapes(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("hidden_size", f"a multiple of num_attention_heads={self.num_attention_heads}", self.hidden_size)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_key_value_heads", f"a divisor of num_attention_heads={self.num_attention_heads}",
                              self.num_key_value_heads)
        if self.head_dim % 2:
            raise ConfigError("hidden_size", "hidden_size/num_attention_heads even (RoPE rotates pairs)", self.hidden_size)
        if self.backend not in ("torch", "te", "auto"):
            raise ConfigError("backend", "one of 'auto', 'te', 'torch'", self.backend)


def config_from_preset(name: str, vocab_size: int, seq_length: int, **overrides) -> YxanulConfig:
    if name not in PRESETS:
        raise ConfigError("model", "one of " + ", ".join(PRESETS), name)
    shape = dict(PRESETS[name])
    shape.update({k: v for k, v in overrides.items() if v is not None})
    return YxanulConfig(vocab_size=pad_vocab(vocab_size), max_position_embeddings=max(seq_length, 1), **shape)


def count_parameters(config: YxanulConfig) -> int:
    """Exact trainable-parameter count of ``YxanulForCausalLM(config)`` (tied embeddings once)."""
    return matmul_parameters(config) + config.vocab_size * config.hidden_size * (0 if config.tie_word_embeddings else 1) \
        + config.num_hidden_layers * 2 * config.hidden_size + config.hidden_size


def matmul_parameters(config: YxanulConfig) -> int:
    """Parameters that take part in a matmul per token (layers' linears + LM head): the N of 6N."""
    h, f, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * config.head_dim
    return L * (2 * h * h + 2 * h * kv + 3 * f * h) + config.vocab_size * h
