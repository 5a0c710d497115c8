"""examples/configs: seed 004's production mixture config and its CPU twin."""

import json
from pathlib import Path

import pytest

from yxanul.config import parse_args
from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.data.template import template_fields
from yxanul.data.twin import write_twin

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
PRODUCTION, TWIN = CONFIGS / "seed004_xlarge_mixture.yaml", CONFIGS / "seed004_cpu_twin.yaml"
SEED_WEIGHTS = [0.45, 0.25, 0.20, 0.10]


def test_production_config_is_the_seeds_run():
    cfg = parse_args(["--config", str(PRODUCTION)])
    d = cfg.data
    assert cfg.model.model == "xlarge" and cfg.model.seq_length == 2048
    assert [e["weight"] for e in d.datasets] == SEED_WEIGHTS and d.mix_by == "tokens"
    assert [e["path"] for e in d.datasets[:3]] == ["HuggingFaceFW/fineweb-edu", "HuggingFaceTB/cosmopedia",
                                                   "HuggingFaceFW/finepdfs"]
    assert d.datasets[0]["name"] == "sample-10BT" and d.streaming and d.shuffle_buffer == 10_000
    qa = d.datasets[3]
    assert qa["path"] == "GBaker/MedQA-USMLE-4-options"  # MedQA's own columns, through a template
    assert template_fields(qa["text_template"]) == ["question", "options", "answer_idx", "answer"]
    assert d.max_tokens == 11_000_000_000
    tokens_per_step = cfg.batch.target_tokens_per_step
    assert tokens_per_step == 131_072
    assert cfg.optim.warmup_tokens == 100_000_000 and cfg.optim.warmup_steps == 763  # 762.94 steps, rounded up
    assert abs(cfg.train.max_steps * tokens_per_step - 11e9) / 11e9 < 0.0001
    assert cfg.optim.max_lr == 3e-4 and abs(cfg.optim.max_lr * cfg.optim.min_lr_ratio - 3e-5) < 1e-12


@pytest.mark.slow
def test_cpu_twin_has_the_same_mixture_and_its_shares_hold(tmp_path, monkeypatch):
    cfg = parse_args(["--config", str(TWIN)])
    assert [e["weight"] for e in cfg.data.datasets] == SEED_WEIGHTS and cfg.data.mix_by == "tokens"
    write_twin(tmp_path / "data" / "twin")
    monkeypatch.chdir(tmp_path)  # the config's paths are relative: data/twin/...
    args = DataArgs(**{**vars(cfg.data), "max_tokens": 300_000, "data_dir": str(tmp_path / "out")})
    out = prepare(args, progress=False, say=lambda *a, **k: None)
    rep = json.loads((out / "meta.json").read_text())["mixture"]
    shares = [r["token_share"] for r in rep.values()]
    assert all(abs(s - w) < 0.01 for s, w in zip(shares, SEED_WEIGHTS)), shares
    qa = rep["data/twin/qa.jsonl"]  # MedQA-shaped rows, rendered by the config's text_template
    first = json.loads((tmp_path / "data" / "twin" / "qa.jsonl").read_text().splitlines()[0])
    assert set(first) == {"question", "options", "answer_idx", "answer"} and qa["documents"] > 100
    docs = [r["document_share"] for r in rep.values()]
    assert docs[0] > 0.6 and docs[2] < 0.02  # short speeches vs whole scenes: tokens are what the weights mean


@pytest.mark.parametrize("config", [PRODUCTION, TWIN])
def test_configs_name_only_known_keys(config):
    parse_args(["--config", str(config)])  # strict: an unknown key or bad value raises
