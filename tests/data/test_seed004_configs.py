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
    # 10 % of 11B is out of reach for MedQA (~2M tokens): 4 epochs, then it leaves and the others renormalise
    assert qa["max_epochs"] == 4 and d.on_source_end == "drop"
    assert all("max_epochs" not in e for e in d.datasets[:3])
    assert d.max_tokens == 11_000_000_000
    tokens_per_step = cfg.batch.target_tokens_per_step
    assert tokens_per_step == 131_072
    assert cfg.optim.warmup_tokens == 100_000_000 and cfg.optim.warmup_steps == 763  # 762.94 steps, rounded up
    assert abs(cfg.train.max_steps * tokens_per_step - 11e9) / 11e9 < 0.0001
    assert cfg.optim.max_lr == 3e-4 and abs(cfg.optim.max_lr * cfg.optim.min_lr_ratio - 3e-5) < 1e-12


@pytest.mark.slow
def test_cpu_twin_has_the_same_mixture_its_qa_set_drops_after_4_epochs(tmp_path, monkeypatch):
    """The twin's 200-row QA set: 45/25/20/10 hold while all four flow; read 4 times, it leaves, and the
    other three go on at 45/25/20 renormalised to max_tokens."""
    cfg = parse_args(["--config", str(TWIN)])
    assert [e["weight"] for e in cfg.data.datasets] == SEED_WEIGHTS and cfg.data.mix_by == "tokens"
    assert cfg.data.datasets[3]["max_epochs"] == 4 and cfg.data.on_source_end == "drop"
    write_twin(tmp_path / "data" / "twin")
    monkeypatch.chdir(tmp_path)  # the config's paths are relative: data/twin/...
    lines = []
    out = prepare(DataArgs(**{**vars(cfg.data), "data_dir": str(tmp_path / "out")}), progress=False, say=lines.append)
    meta = json.loads((out / "meta.json").read_text())
    rep, names = meta["mixture"], [e["path"] for e in cfg.data.datasets]
    qa = rep[names[3]]
    first = json.loads((tmp_path / "data" / "twin" / "qa.jsonl").read_text().splitlines()[0])
    assert set(first) == {"question", "options", "answer_idx", "answer"}  # MedQA's columns, through the template
    assert qa["documents"] == 4 * 200 and qa["epochs_completed"] == 4 and "dropped_at_tokens" in qa
    assert abs(qa["tokens"] / qa["dropped_at_tokens"] - 0.10) < 0.01  # its 10 % while it flowed
    assert sum(r["tokens"] for r in rep.values()) >= cfg.data.max_tokens  # the others went on to max_tokens
    shards = [m["sources"] for m in meta["splits"]["train"]["manifest"] if names[3] not in m["sources"]]
    after = [sum(s.get(n, 0) for s in shards) for n in names[:3]]
    assert shards and all(abs(a / sum(after) - w / 0.9) < 0.01 for a, w in zip(after, SEED_WEIGHTS)), after
    docs = [r["document_share"] for r in rep.values()]
    assert docs[0] > 0.6 and docs[2] < 0.02  # short speeches vs whole scenes: tokens are what the weights mean
    assert any(f"'{names[3]}' left the mixture at {qa['dropped_at_tokens']:,} tokens" in line for line in lines)


@pytest.mark.parametrize("config", [PRODUCTION, TWIN])
def test_configs_name_only_known_keys(config):
    parse_args(["--config", str(config)])  # strict: an unknown key or bad value raises
