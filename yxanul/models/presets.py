"""The model presets and backends: plain data, importable without torch or transformers (the CLI's
``--help`` and config validation need them; ``YxanulConfig`` builds from them)."""

BACKENDS = ("auto", "te", "torch")

# name -> shape. Parameter counts (printed at start, tabulated in docs/models.md) come from
# count_parameters(). `tiny` ... `xlarge` are the seed-004 table's names, layers and widths; its sizes
# (85M, 178M, 374M, 401M, 763M, 1.46B) are matched within 1.5 % at GPT-2's vocabulary padded to 50,304.
# `nano` is the 5M CPU demo model of the embedded default (it was called `tiny` before the seed table).
# All FFN widths are multiples of 64 (FP8 GEMMs need multiples of 16; tensor cores like 64/128).
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
}
