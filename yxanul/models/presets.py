"""The model presets and backends: plain data, importable without torch or transformers (the CLI's
``--help`` and config validation need them; ``YxanulConfig`` builds from them)."""

BACKENDS = ("auto", "te", "torch")

# name -> shape. Parameter counts (printed at start, tabulated in docs/models.md) come from
# count_parameters(). `tiny` ... `xlarge` are the seed-004 table's names, layers and widths; its sizes
# (85M, 178M, 374M, 401M, 763M, 1.46B) are matched within 1.5 % at GPT-2's vocabulary padded to 50,304.
# `nano` is the 5M CPU demo model of the embedded default.
# All FFN widths are multiples of 64 (FP8 GEMMs need multiples of 16; tensor cores like 64/128).
# `3b` and `7b` are Llama-3 layer shapes with GQA (8 KV heads, head_dim 128): `3b` is Llama-3.2-3B's
# (3,212,749,824 parameters at its tied 128,256 vocabulary), `7b` Llama-3-8B's (8,030,261,248 untied at
# 128,256). `7b` takes Llama-3's FFN 14336, not Llama-2-7B's 11008: with 8 KV heads instead of 32 the
# 11008 shape has 5.9B parameters (GPT-2 vocabulary), 14336 gives 7.2B and is a shape trained at scale.
_SHAPE = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
PRESETS: dict[str, dict] = {name: dict(zip(_SHAPE, shape, strict=True)) for name, shape in {
    "nano":         ( 4,  256,  4,  2,   704),
    "tiny":         (12,  512,  8,  8,  2560),
    "gpt2-124m":    (12,  768, 12, 12,  2048),
    "small":        (16,  768, 12, 12,  2816),
    "medium":       (24, 1024, 16, 16,  3072),
    "medium-large": (20, 1152, 18, 18,  3456),
    "yxanul-0.6b":  (21, 1536, 12,  4,  4096),
    "large":        (24, 1536, 12, 12,  4096),
    "xlarge":       (32, 1920, 15, 15,  4864),
    "3b":           (28, 3072, 24,  8,  8192),
    "7b":           (32, 4096, 32,  8, 14336),
}.items()}

# The vocabulary (embedding rows, LM-head GEMM width) is padded up to a multiple of this: 64 by default;
# 128 for the multi-GPU presets (Megatron's make-vocab-size-divisible-by, Llama-3's 128,256), one full
# 128-wide tensor-core tile per column block of the largest GEMM.
VOCAB_MULTIPLE: dict[str, int] = {"3b": 128, "7b": 128}
