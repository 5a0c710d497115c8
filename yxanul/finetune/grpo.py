"""`yxanul grpo MODEL [--dataset usmle_mini|FILE|HUB_NAME] [--sft_steps N] [--max_steps N] [--output_dir D]`.

GRPO after pretraining, on multiple-choice QA in MedQA's shape (:mod:`yxanul.finetune.qa`), through TRL's
``GRPOTrainer``: per prompt ``num_generations`` sampled completions, rewarded by ``format_reward`` (the
completion begins with an option letter) and ``answer_reward`` (that letter is the true one).

A freshly pretrained base rarely answers with a letter at all: every completion of a group then scores 0,
the group advantage is 0 and GRPO has nothing to learn from. ``--sft_steps N`` first runs TRL's
``SFTTrainer`` for N steps on the same rows' `` <letter>. <option>`` targets, so the policy follows the
format before GRPO starts. MODEL is a run, checkpoint or export; a yxanul model is trained as the
``LlamaForCausalLM`` with the same weights (:mod:`yxanul.integrations.causal_lm`); ``--lora_r R`` trains PEFT LoRA
adapters on its linear layers instead of every weight (both stages). The output folder gets ``model/``
(save_pretrained + tokenizer, adapters merged: loads with plain transformers), ``metrics.jsonl`` (every logged
step of both stages: ``reward``, ``rewards/answer_reward/mean``, ``loss``, ...) and ``grpo_summary.json``.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._deepspeed import import_deepspeed_quietly
from ..checkpoint import EarlierOutput, check_out_spares_runs
from ..data.args import DataArgs
from ..errors import ConfigError, UserError, require
from ..flags import parse_command, same_as
from .qa import answer_reward, format_reward, grpo_dataset, load_qa, prompt_of, sft_dataset

SUMMARY = "grpo_summary.json"
# the one non-empty output_dir --overwrite replaces: a finished earlier run of this command (model/ below it)
EARLIER = EarlierOutput("yxanul grpo", SUMMARY, flat=False)


@dataclass
class GrpoCommand:
    """GRPO (TRL) on multiple-choice QA from a run, checkpoint or export; optional SFT first."""

    model: str = field(metadata={"positional": True, "help": "Run directory, checkpoint folder or export folder."})
    dataset: str = field(default="usmle_mini", metadata={
        "help": "usmle_mini (bundled, 32 USMLE-style items), a .jsonl/.json/.parquet file, or a Hub dataset with "
                "MedQA's columns, e.g. GBaker/MedQA-USMLE-4-options."})
    dataset_name: str | None = same_as(DataArgs, "dataset_name")
    split: str = field(default="train", metadata={"help": "Split of a Hub dataset."})
    limit: int | None = field(default=None, metadata={"help": "Use only the first N rows."})
    output_dir: str = field(default="runs/grpo", metadata={"help": "Output folder (new or empty)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output folder."})
    sft_steps: int = field(default=0, metadata={
        "help": "TRL SFTTrainer steps on '<letter>. <option>' targets before GRPO (for a base that does not yet "
                "answer with a letter)."})
    sft_learning_rate: float = field(default=1e-3, metadata={"help": "SFT learning rate."})
    max_steps: int = field(default=40, metadata={"help": "GRPO optimizer steps."})
    learning_rate: float = field(default=1e-4, metadata={"help": "GRPO learning rate."})
    batch_size: int = field(default=16, metadata={
        "help": "Completions per step (prompts per step = batch_size / num_generations)."})
    num_generations: int = field(default=4, metadata={"help": "Sampled completions per prompt (the GRPO group)."})
    max_completion_length: int = field(default=8, metadata={"help": "Tokens generated per completion."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the rollouts."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient to the starting model (0: no reference "
                                                       "model, TRL's default)."})
    lora_r: int = field(default=0, metadata={
        "help": "LoRA rank on every linear layer of both stages (PEFT; the base stays frozen and, with --beta, is "
                "the reference model without a second copy); 0: full fine-tuning. model/ holds the merged weights."})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA scale numerator (default: 2 x lora_r)."})
    seed: int = field(default=0, metadata={"help": "Seed (sampling, shuffling)."})
    device: str = field(default="auto", metadata={"help": "auto (cuda if available) or cpu."})

    def __post_init__(self):
        for key in ("max_steps", "batch_size", "max_completion_length"):
            if getattr(self, key) < 1:
                raise ConfigError(key, "an integer >= 1", getattr(self, key))
        if self.num_generations < 2:
            raise ConfigError("num_generations", "an integer >= 2 (GRPO compares completions of a prompt)",
                              self.num_generations)
        if self.batch_size % self.num_generations:
            raise ConfigError("batch_size", f"a multiple of num_generations ({self.num_generations})", self.batch_size)
        if self.sft_steps < 0:
            raise ConfigError("sft_steps", "an integer >= 0 (0: no SFT)", self.sft_steps)
        if self.limit is not None and self.limit < 1:
            raise ConfigError("limit", "an integer >= 1", self.limit)
        for key in ("learning_rate", "sft_learning_rate", "temperature"):
            if not getattr(self, key) > 0:
                raise ConfigError(key, "a number > 0", getattr(self, key))
        if self.beta < 0:
            raise ConfigError("beta", "a number >= 0", self.beta)
        if self.lora_r < 0:
            raise ConfigError("lora_r", "an integer >= 0 (0: no LoRA)", self.lora_r)
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            raise ConfigError("lora_alpha", "a number > 0", self.lora_alpha)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError("device", "auto, cpu or cuda", self.device)


def _common(a: GrpoCommand, out: Path, cpu: bool) -> dict:
    """TrainingArguments shared by both stages: log every step, no checkpoints (the model is saved at the
    end, or on Ctrl-C), no trackers, fp32 on CPU and bf16 autocast on a GPU that has it."""
    import torch

    return {"output_dir": str(out / "trainer"), "logging_steps": 1, "save_strategy": "no", "report_to": "none",
            "seed": a.seed, "data_seed": a.seed, "use_cpu": cpu, "bf16": not cpu and torch.cuda.is_bf16_supported(),
            "disable_tqdm": True, "lr_scheduler_type": "constant", "warmup_steps": 0}


def run_sft(a: GrpoCommand, model, tok, ds, out: Path, cpu: bool):
    from trl import SFTConfig, SFTTrainer

    from .callbacks import MetricsLog  # torch: --help stays light

    args = SFTConfig(max_steps=a.sft_steps, learning_rate=a.sft_learning_rate, per_device_train_batch_size=8,
                     max_length=int(model.config.max_position_embeddings), **_common(a, out, cpu))
    trainer = SFTTrainer(model=model, args=args, train_dataset=sft_dataset(ds), processing_class=tok,
                         callbacks=[MetricsLog(out / "metrics.jsonl", "sft")])
    _train(trainer, out, tok)
    return trainer.model


def run_grpo(a: GrpoCommand, model, tok, ds, out: Path, cpu: bool):
    from trl import GRPOConfig, GRPOTrainer

    from .callbacks import MetricsLog  # torch: --help stays light

    args = GRPOConfig(max_steps=a.max_steps, learning_rate=a.learning_rate, per_device_train_batch_size=a.batch_size,
                      num_generations=a.num_generations, max_completion_length=a.max_completion_length,
                      temperature=a.temperature, beta=a.beta, **_common(a, out, cpu))
    trainer = GRPOTrainer(model=model, reward_funcs=[format_reward, answer_reward], args=args,
                          train_dataset=grpo_dataset(ds), processing_class=tok,
                          callbacks=[MetricsLog(out / "metrics.jsonl", "grpo")])
    _train(trainer, out, tok)
    return trainer


@contextlib.contextmanager
def quiet_library_renames():
    """transformers 5 renamed ``gradient_checkpointing*`` to ``activation_checkpointing*`` and TRL's configs and
    trainers still use the old names: a FutureWarning (and its source line) per use that a `yxanul grpo` user
    cannot act on. Those alone are dropped; DeepSpeed is imported without its CPU notice (accelerate imports it)."""
    import_deepspeed_quietly()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`\w*gradient_checkpointing\w*` is deprecated", FutureWarning)
        yield


def _train(trainer, out: Path, tok) -> None:
    """Train; on Ctrl-C the model trained so far is saved to OUT/model first (nothing trained is lost)."""
    try:
        trainer.train()
    except KeyboardInterrupt:
        save(trainer.model, tok, out)
        print(f"interrupted: the model trained so far is in {out / 'model'}", flush=True)
        raise


def with_lora(a: GrpoCommand, model):
    """``model`` with LoRA adapters on every linear layer but the LM head (PEFT's "all-linear"), when ``lora_r``."""
    if not a.lora_r:
        return model
    require("peft", "grpo", "yxanul grpo --lora_r")
    from peft import LoraConfig, get_peft_model

    alpha = a.lora_alpha if a.lora_alpha is not None else 2.0 * a.lora_r
    return get_peft_model(model, LoraConfig(r=a.lora_r, lora_alpha=alpha, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))


def save(model, tok, out: Path) -> None:
    """OUT/model: what plain transformers loads (LoRA adapters merged into their base weights)."""
    if hasattr(model, "merge_and_unload"):  # a PeftModel
        model = model.merge_and_unload()
    model.save_pretrained(str(out / "model"))
    tok.save_pretrained(str(out / "model"))


def reward_curve(out: Path) -> list[float]:
    """The mean GRPO reward of every logged step, from metrics.jsonl."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["reward"] for r in rows if r.get("stage") == "grpo" and "reward" in r]


def prepare_output(a: GrpoCommand) -> Path:
    import shutil

    out = Path(a.output_dir)
    if out.exists() and any(out.iterdir()):  # checked by `grpo` first: spares every trained file
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def fitting(ds, tok, max_prompt: int, dataset: str, say):
    """The rows whose prompt fits the model's positions with the completion after it; the others are left
    out (said), since a model trained at seq_length T has never seen a position past T."""
    keep = [i for i, r in enumerate(ds) if len(tok(prompt_of(r)).input_ids) <= max_prompt]
    if not keep:
        raise UserError(f"dataset '{dataset}': every prompt is longer than {max_prompt} tokens (the model's "
                        "max_position_embeddings minus --max_completion_length); use a model trained at a longer "
                        "seq_length or a shorter --max_completion_length")
    if len(keep) < len(ds):
        say(f"{len(ds) - len(keep)} of {len(ds)} questions left out: prompt longer than {max_prompt} tokens")
    return ds.select(keep)


def grpo(a: GrpoCommand, say=print) -> dict:
    """SFT (``sft_steps`` > 0), then GRPO; returns the summary also written to grpo_summary.json."""
    import torch

    from ..integrations.causal_lm import load_causal_lm  # torch: --help stays light

    require("trl", "grpo", "yxanul grpo")
    cpu = a.device == "cpu" or not torch.cuda.is_available()
    if a.device == "cuda" and cpu:
        raise UserError("device 'cuda': no CUDA GPU here (use --device cpu)")
    check_out_spares_runs(a.output_dir, a.model, "output_dir", a.overwrite, EARLIER)  # --overwrite deletes it
    ds = load_qa(a.dataset, a.split, a.dataset_name, a.limit)  # a bad dataset fails before the model loads
    model, tok = load_causal_lm(a.model)
    positions = int(model.config.max_position_embeddings)
    if a.max_completion_length >= positions:  # no position left for a prompt
        raise ConfigError("max_completion_length", f"fewer tokens than the model's {positions} positions "
                                                   "(max_position_embeddings), which hold the prompt too",
                          a.max_completion_length)
    ds = fitting(ds, tok, positions - a.max_completion_length, a.dataset, say)
    prompts = a.batch_size // a.num_generations
    if len(ds) < prompts:  # TRL's sampler would yield no batch: 0 steps, then "done"
        raise UserError(f"dataset '{a.dataset}': {len(ds)} questions, fewer than the {prompts} prompts of a step "
                        f"(--batch_size {a.batch_size} / --num_generations {a.num_generations}); lower --batch_size "
                        "or take more questions (--limit)")
    model = with_lora(a, model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out = prepare_output(a)
    say(f"{len(ds)} questions from {a.dataset}; {trainable:,} trainable parameters; output {out}")
    with quiet_library_renames():
        if a.sft_steps:
            model = run_sft(a, model, tok, ds, out, cpu)
        trainer = run_grpo(a, model, tok, ds, out, cpu)
    save(trainer.model, tok, out)
    curve = reward_curve(out)
    k = max(1, len(curve) // 4)
    summary = {"args": asdict(a), "questions": len(ds), "trainable_parameters": trainable,
               "reward_first": sum(curve[:k]) / k,
               "reward_last": sum(curve[-k:]) / k, "steps": len(curve), "model": str(out / "model")}
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))
    say(f"mean reward (format + answer, max 2): first {k} steps {summary['reward_first']:.3f} -> last {k} steps "
        f"{summary['reward_last']:.3f}; model saved to {out / 'model'}")
    return summary


def main(argv: list[str] | None = None) -> int:
    grpo(parse_command(GrpoCommand, argv, prog="yxanul grpo"))
    return 0
