"""The model presets and backends: plain data, importable without torch or transformers (the CLI's
``--help`` and config validation need them; ``YxanulConfig`` builds from them)."""

BACKENDS = ("auto", "te", "torch")

# name -> shape. Parameter counts (printed at start, tabulated in docs/models.md) come from
# count_parameters(); the "≈" sizes are the seed documents' names for them at vocab 50,304.
# All FFN widths are multiples of 64 (FP8 GEMMs need multiples of 16; tensor cores like 64/128).
PRESETS: dict[str, dict] = {
    "tiny":        dict(num_hidden_layers=4,  hidden_size=256,  num_attention_heads=4,  num_key_value_heads=2,  intermediate_size=704),
    "gpt2-124m":   dict(num_hidden_layers=12, hidden_size=768,  num_attention_heads=12, num_key_value_heads=12, intermediate_size=2048),
    "small":       dict(num_hidden_layers=16, hidden_size=768,  num_attention_heads=12, num_key_value_heads=12, intermediate_size=2816),
    "medium":      dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, num_key_value_heads=16, intermediate_size=3072),
    "yxanul-0.6b": dict(num_hidden_layers=21, hidden_size=1536, num_attention_heads=12, num_key_value_heads=4,  intermediate_size=4096),
    "large":       dict(num_hidden_layers=24, hidden_size=1536, num_attention_heads=12, num_key_value_heads=12, intermediate_size=4096),
    "xlarge":      dict(num_hidden_layers=32, hidden_size=1920, num_attention_heads=15, num_key_value_heads=15, intermediate_size=4864),
}
