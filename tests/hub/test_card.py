"""The model card's numbers (yxanul/hub/card.py): a mixture's weights as shares of their total, the throughput
as the median of the logged steps (a warm-up or a stalled step does not move it)."""

import json

import yaml

from yxanul.hub.card import build_card
from yxanul.models import config_from_preset


def test_card_reads_mixture_shares_and_the_median_throughput(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"model": "nano", "datasets": [
        {"path": "org/web", "weight": 3}, {"path": "org/code", "name": "py", "weight": 1}]}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5.0, "tokens_per_sec": t}) + "\n"
                                               for s, t in ((1, 1.0), (2, 100.0), (3, 3.0), (4, 50.0), (5, 2.0))))
    card = build_card(config_from_preset("nano", 512, 64), run, {"step": 3, "tokens_seen": 300, "val_loss": 4.0})
    assert "- `org/web`: weight 75.0%" in card and "- `org/code` (py): weight 25.0%" in card
    assert "throughput 3 tokens/s (median)" in card  # not the last (2), not the mean (31)
    assert "datasets:\n- org/web\n- org/code" in card  # the Hub metadata names both
