"""Presets, config validation and the analytical parameter count (checked against meta-device builds)."""

import re
from pathlib import Path

import pytest
import torch

from yxanul.errors import ConfigError
from yxanul.models import (
    PRESETS,
    YxanulConfig,
    YxanulForCausalLM,
    config_from_preset,
    count_parameters,
    pad_vocab,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def built_count(cfg) -> int:
    with torch.device("meta"):  # no memory, no init cost, even for xlarge
        model = YxanulForCausalLM(cfg)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


@pytest.mark.parametrize("name", list(PRESETS))
def test_count_parameters_equals_the_built_model(name):
    for vocab, tied in ((50257, True), (8192, False)):
        cfg = config_from_preset(name, vocab, 2048, backend="torch", tie_word_embeddings=tied)
        assert count_parameters(cfg) == built_count(cfg), (name, vocab, tied)


# seed 004's model table: name -> (params in millions, layers, hidden)
SEED_004 = {"tiny": (85, 12, 512), "small": (178, 16, 768), "medium": (374, 24, 1024),
            "medium-large": (401, 20, 1152), "large": (763, 24, 1536), "xlarge": (1460, 32, 1920)}
CPU_DEMO = "nano"  # the embedded default's 5M model (was `tiny` before the seed table took the name)


def test_seed_004_table_by_name_and_size():
    for name, (millions, layers, hidden) in SEED_004.items():
        n = count_parameters(config_from_preset(name, 50304, 2048)) / 1e6
        assert abs(n - millions) / millions < 0.015, (name, n)
        assert (PRESETS[name]["num_hidden_layers"], PRESETS[name]["hidden_size"]) == (layers, hidden), name


def test_seed_sizes_at_vocab_50304():
    n = {k: count_parameters(config_from_preset(k, 50304, 2048)) / 1e6 for k in PRESETS}
    for name, target in {"gpt2-124m": 124, "yxanul-0.6b": 600}.items():
        assert abs(n[name] - target) / target < 0.02, (name, n[name])
    assert (PRESETS["xlarge"]["num_hidden_layers"], PRESETS["xlarge"]["hidden_size"]) == (32, 1920)
    assert (PRESETS["small"]["num_hidden_layers"], PRESETS["small"]["hidden_size"]) == (16, 768)
    assert (PRESETS["medium"]["num_hidden_layers"], PRESETS["medium"]["hidden_size"]) == (24, 1024)
    assert (PRESETS["large"]["num_hidden_layers"], PRESETS["large"]["hidden_size"]) == (24, 1536)
    g = PRESETS["gpt2-124m"]
    assert (g["num_hidden_layers"], g["hidden_size"], g["num_attention_heads"]) == (12, 768, 12)
    assert config_from_preset("gpt2-124m", 50257, 1024).tie_word_embeddings


def test_nano_is_the_cpu_demo_of_the_default_config():
    from yxanul.config import DEFAULT_CONFIG

    assert f"model: {CPU_DEMO}" in Path(DEFAULT_CONFIG).read_text().splitlines()
    cfg = config_from_preset(CPU_DEMO, 8192, 256)
    assert cfg.num_hidden_layers == 4 and cfg.hidden_size == 256 and cfg.num_key_value_heads < cfg.num_attention_heads
    assert count_parameters(cfg) < 6e6


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_shapes_are_fp8_and_tensor_core_friendly(name):
    cfg = config_from_preset(name, 50257, 2048)
    assert cfg.vocab_size % 64 == 0 and cfg.intermediate_size % 64 == 0 and cfg.hidden_size % 64 == 0
    assert (cfg.num_key_value_heads * cfg.head_dim) % 16 == 0 and cfg.head_dim % 16 == 0


# Llama shapes the multi-GPU presets reproduce (published parameter counts, vocabulary 128,256)
LLAMA = {"3b": ("Llama-3.2-3B", True, 3_212_749_824), "7b": ("Llama-3-8B", False, 8_030_261_248)}


@pytest.mark.parametrize("name", list(LLAMA))
def test_multi_gpu_presets_are_llama_3_shapes(name):
    llama, tied, published = LLAMA[name]
    cfg = config_from_preset(name, 128256, 8192, backend="torch", tie_word_embeddings=tied)
    assert count_parameters(cfg) == built_count(cfg) == published, llama
    assert cfg.num_key_value_heads == 8 < cfg.num_attention_heads and cfg.head_dim == 128   # GQA
    assert config_from_preset(name, 50257, 2048).vocab_size == 50304                          # 393 x 128
    assert config_from_preset(name, 32001, 2048).vocab_size == 32128                          # not 32064 (x 64)
    assert config_from_preset("xlarge", 32001, 2048).vocab_size == 32064                      # others: x 64


def test_pad_vocab():
    assert [pad_vocab(n) for n in (1, 64, 65, 50257, 50304)] == [64, 64, 128, 50304, 50304]
    assert pad_vocab(100, multiple=128) == 128
    with pytest.raises(ConfigError):
        pad_vocab(0)


def test_config_from_preset_overrides_and_errors():
    cfg = config_from_preset("nano", 1000, 128, num_key_value_heads=1, tie_word_embeddings=None, backend="torch")
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.num_key_value_heads) == (1024, 128, 1)
    assert cfg.tie_word_embeddings is True                      # None = keep the preset's default
    with pytest.raises(ConfigError, match="expected one of nano, tiny, gpt2-124m"):
        config_from_preset("huge", 1000, 128)
    with pytest.raises(ConfigError, match="seq_length"):
        config_from_preset("nano", 1000, 0)


@pytest.mark.parametrize("kw,key", [
    (dict(hidden_size=250, num_attention_heads=4), "hidden_size"),           # not a multiple of heads
    (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
    (dict(hidden_size=60, num_attention_heads=4, num_key_value_heads=4), "hidden_size"),  # head_dim 15: odd
    (dict(num_hidden_layers=0), "num_hidden_layers"),
    (dict(backend="cuda"), "backend"),
])
def test_bad_shapes_raise_config_error(kw, key):
    with pytest.raises(ConfigError) as e:
        YxanulConfig(**kw)
    assert e.value.key == key


def test_config_json_round_trip(tmp_path):
    cfg = config_from_preset("yxanul-0.6b", 50257, 2048, backend="torch")
    cfg.save_pretrained(tmp_path)
    back = YxanulConfig.from_pretrained(tmp_path)
    for k in ("vocab_size", "num_key_value_heads", "intermediate_size", "rope_theta", "backend", "tie_word_embeddings",
              "max_position_embeddings"):
        assert getattr(back, k) == getattr(cfg, k), k
    assert back.head_dim == 128


def test_docs_table_matches_the_code():
    """docs/models.md's preset table is generated from count_parameters: keep it honest."""
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`([\w.-]+)`\s*\|(.*)\|\s*$", line)
        if m and m.group(1) in PRESETS:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    assert set(rows) == set(PRESETS)
    for name, cells in rows.items():
        p = PRESETS[name]
        shape = [p["num_hidden_layers"], p["hidden_size"], p["num_attention_heads"], p["num_key_value_heads"],
                 p["intermediate_size"]]
        assert [int(c) for c in cells[:5]] == shape, name
        for cell, vocab in zip(cells[5:7], (50304, 8192)):
            n = count_parameters(config_from_preset(name, vocab, 2048))
            assert cell == f"{n / 1e6:,.1f}M", (name, vocab, cell)
        assert cells[7] == f"{config_from_preset(name, 50304, 2048).flops_per_token() / 1e9:,.2f}", name
