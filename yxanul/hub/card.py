"""The model card (README.md with YAML metadata) and the loss-curve PNG of an exported run.

Built with huggingface_hub's ``ModelCard``/``ModelCardData`` (the metadata block the Hub parses). Every
number comes from the run's own files: ``config.yaml``, the checkpoint's ``trainer_state.json``,
``precision_report.json`` and ``metrics.jsonl``. Nothing from the environment goes in (no token).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..checkpoint.io import saved_config
from ..models.configuration_yxanul import count_parameters

BUNDLED_CORPUS = "the bundled Shakespeare corpus (yxanul/assets/corpus, public domain)"
LOSS_PNG = "loss_curve.png"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    f = run_dir / "metrics.jsonl"
    if not f.is_file():
        return []
    rows = []
    for line in f.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return rows


def loss_series(rows: list[dict[str, Any]]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(train, val) as (step, loss) pairs by step, the last row of a step winning; train is the LM loss."""
    train = {r["step"]: r.get("lm_loss", r["loss"]) for r in rows if "loss" in r and "step" in r}
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r and "step" in r}
    return sorted(train.items()), sorted(val.items())


def plot_loss(rows: list[dict[str, Any]], out: Path) -> Path | None:
    """Training and validation loss against the optimizer step (matplotlib, Agg); None without training rows.
    The training curve is the LM loss (``lm_loss`` where a penalty was added): cross entropy, like val;
    a step logged twice (a resume) is drawn once, its last row."""
    train, val = loss_series(rows)
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*train), ".-" if len(train) <= 60 else "-", label="train loss", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss", ms=3)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross entropy (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _data_lines(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(markdown lines about the data, Hub dataset ids for the metadata)."""
    mixture = cfg.get("datasets")
    if mixture:
        total = sum(float(d.get("weight", 1.0)) for d in mixture)
        lines = [f"- `{d['path']}`" + (f" ({d['name']})" if d.get("name") else "")
                 + f": weight {float(d.get('weight', 1.0)) / total:.1%}" for d in mixture]
        ids = [d["path"] for d in mixture]
    elif cfg.get("dataset"):
        lines = [f"- `{cfg['dataset']}`" + (f" ({cfg['dataset_name']})" if cfg.get("dataset_name") else "")]
        ids = [cfg["dataset"]]
    else:
        lines, ids = [f"- {BUNDLED_CORPUS}"], []
    hub_ids = [i for i in ids if "/" in i and not Path(i).exists() and not any(c in i for c in "*?")
               and not i.startswith((".", "/"))]
    return lines, hub_ids


def _precision_lines(report: dict[str, Any]) -> list[str]:
    if not report:
        return ["- precision: not recorded"]
    lines = [f"- precision: **{report.get('precision', '?')}** (backend {report.get('backend', '?')})"]
    recipe = report.get("configured_recipe")
    if recipe:
        lines.append(f"- FP8 recipe: `{recipe.get('name')}` {json.dumps(recipe.get('kwargs') or {})}")
    base = report.get("base_dtype", "bf16")  # reports before base_dtype keyed every non-FP8 count "bf16"
    for kind, d in (report.get("layers") or {}).items():
        lines.append(f"  - {kind}: {d.get('fp8', 0)} layers in FP8, {d.get(base, 0)} in "
                     f"{report.get('non_fp8_precision', base.upper())}" + (f" ({d['why']})" if d.get("why") else ""))
    return lines


FORMAT_INTRO = {
    "llama": "exported as a standard `LlamaForCausalLM`: it loads with plain `transformers`, no `trust_remote_code`.",
    "yxanul": "in yxanul's native format (`YxanulForCausalLM`, the Transformer Engine / FP8-ready model that "
              "fine-tunes with FP8 under Trainer-based tools). Loading it needs `pip install yxanul` and "
              "`import yxanul`, which registers the `yxanul` model type with transformers' Auto classes "
              "(no `trust_remote_code`: no code ships with the weights). For a folder that loads without "
              "yxanul, export with `--format llama`.",
}


def usage_snippet(fmt: str, repo_id: str | None) -> list[str]:
    """The card's "Use" code: runs as written in the export folder (or with the Hub id)."""
    where = repr(repo_id or ".")
    head = ["import yxanul  # registers the 'yxanul' model type with transformers"] if fmt == "yxanul" else []
    return ["```python", *head, "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f"tok = AutoTokenizer.from_pretrained({where})",
            f"model = AutoModelForCausalLM.from_pretrained({where})",
            "inputs = tok('ROMEO:', return_tensors='pt')",
            "print(tok.decode(model.generate(**inputs, max_new_tokens=40, do_sample=True, top_k=50)[0]))", "```"]


def build_card(config, run_dir: Path | None, state: dict[str, Any], license: str = "other",
               repo_id: str | None = None, has_plot: bool = False, fmt: str = "llama") -> str:
    """README.md text: YAML metadata + architecture, data, tokens, loss, precision, hardware, loss curve,
    and the intro and usage code of the export format ``fmt`` ("llama" or "yxanul")."""
    from huggingface_hub import ModelCard, ModelCardData

    cfg = saved_config(run_dir) if run_dir else {}
    report = _json(run_dir / "precision_report.json") if run_dir else {}
    rows = read_metrics(run_dir) if run_dir else []
    data, hub_ids = _data_lines(cfg)
    # the exported checkpoint's own val loss: the run's last one may belong to another (later, or re-saved) model
    val = state.get("val_loss")
    tps = [r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r]
    meta = ModelCardData(license=license, library_name="transformers", datasets=hub_ids or None,
                         tags=["yxanul", "llama" if fmt == "llama" else "fp8-ready", "text-generation", "pretraining"]
                         + (["fp8"] if report.get("fp8") else []), pipeline_tag="text-generation")
    c = config
    body = [f"# {repo_id or 'yxanul model'}", "",
            "A decoder-only language model pretrained from scratch with yxanul "
            "(Transformer Engine / accelerate on the Hugging Face stack), " + FORMAT_INTRO[fmt], "",
            "## Architecture", "",
            f"- {count_parameters(c):,} parameters ({count_parameters(c) / 1e6:.1f}M), Llama-style: RMSNorm, "
            "SwiGLU, RoPE, no biases",
            f"- {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads "
            f"({c.num_key_value_heads} key/value heads), FFN {c.intermediate_size}, vocabulary {c.vocab_size}, "
            f"context {c.max_position_embeddings}, RoPE theta {c.rope_theta:g}, tied embeddings: "
            f"{c.tie_word_embeddings}",
            f"- preset `{cfg.get('model', '?')}`", "", "## Training data", "", *data, "",
            "## Training", "",
            f"- tokens seen: {state.get('tokens_seen', 0):,} in {state.get('step', '?')} optimizer steps"]
    if val is not None:
        body.append(f"- validation loss of this checkpoint: {val:.4f} (perplexity {math.exp(min(val, 50)):.2f})")
    else:
        body.append("- validation loss: not measured at this checkpoint's step")
    body += _precision_lines(report)
    if report.get("device") or tps:
        body.append(f"- hardware: {report.get('device') or 'CPU'} x {state.get('world_size', 1)}"
                    + (f"; throughput {sorted(tps)[len(tps) // 2]:,.0f} tokens/s (median)" if tps else ""))
    if has_plot:
        body += ["", "## Loss curve", "", f"![loss curve]({LOSS_PNG})"]
    body += ["", "## Use", "", *usage_snippet(fmt, repo_id), ""]
    return str(ModelCard("---\n" + meta.to_yaml() + "\n---\n\n" + "\n".join(body)))


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}
