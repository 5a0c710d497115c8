"""The model presets and backends: plain data, importable without torch or transformers (the CLI's
``--help`` and config validation need them; ``YxanulConfig`` builds from them)."""

BACKENDS = ("auto", "te", "torch")

# name -> shape. Parameter counts (printed at start, tabulated in docs/models.md) come from
# count_parameters(). `tiny` ... `xlarge` are the seed-004 table's names, layers and widths; its sizes
# (85M, 178M, 374M, 401M, 763M, 1.46B) are matched within 1.5 % at GPT-2's vocabulary padded to 50,304.
# `nano` is the 5M CPU demo model of the embedded default (it was called `tiny` before the seed table).
# All FFN widths are multiples of 64 (FP8 GEMMs need multiples of 16; tensor cores like 64/128).
# `3b` and `7b` are Llama-3 layer shapes with GQA (8 KV heads, head_dim 128): `3b` is Llama-3.2-3B's
# (3,212,749,824 parameters at its tied 128,256 vocabulary), `7b` Llama-3-8B's (8,030,261,248 untied at
# 128,256). `7b` takes Llama-3's FFN 14336, not Llama-2-7B's 11008: with 8 KV heads instead of 32 the
# 11008 shape has 5.9B parameters (GPT-2 vocabulary), 14336 gives 7.2B and is a shape trained at scale.
PRESETS: dict[str, dict] = {
    "nano":        dict(num_hidden_layers=4,  hidden_size=256,  num_attention_heads=4,  num_key_value_heads=2,  intermediate_size=704),
    "tiny":        dict(num_hidden_layers=12, hidden_size=512,  num_attention_heads=8,  num_key_value_heads=8,  intermediate_size=2560),
    "gpt2-124m":   dict(num_hidden_layers=12, hidden_size=768,  num_attention_heads=12, num_key_value_heads=12, intermediate_size=2048),
    "small":       dict(num_hidden_layers=16, hidden_size=768,  num_attention_heads=12, num_key_value_heads=12, intermediate_size=2816),
    "medium":      dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, num_key_value_heads=16, intermediate_size=3072),
    "medium-large": dict(num_hidden_layers=20, hidden_size=1152, num_attention_heads=18, num_key_value_heads=18, intermediate_size=3456),
    "yxanul-0.6b": dict(num_hidden_layers=21, hidden_size=1536, num_attention_heads=12, num_key_value_heads=4,  intermediate_size=4096),
    "large":       dict(num_hidden_layers=24, hidden_size=1536, num_attention_heads=12, num_key_value_heads=12, intermediate_size=4096),
    "xlarge":      dict(num_hidden_layers=32, hidden_size=1920, num_attention_heads=15, num_key_value_heads=15, intermediate_size=4864),
    "3b":          dict(num_hidden_layers=28, hidden_size=3072, num_attention_heads=24, num_key_value_heads=8,  intermediate_size=8192),
    "7b":          dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,  intermediate_size=14336),
}

# The vocabulary (embedding rows, LM-head GEMM width) is padded up to a multiple of this: 64 by default;
# 128 for the multi-GPU presets (Megatron's make-vocab-size-divisible-by, Llama-3's 128,256), one full
# 128-wide tensor-core tile per column block of the largest GEMM.
VOCAB_MULTIPLE: dict[str, int] = {"3b": 128, "7b": 128}
