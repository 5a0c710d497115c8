"""GPU + TE: TRL's trainers on the NATIVE model (TE blocks) with yxanul's precision plan in FP8: TE itself
reports the configured delayed recipe (the read-back), the loss is finite and the weights move. SFT: the
collator pads to a multiple of 16 (TE's FP8 GEMMs need token counts in multiples of 16); GRPO: rollouts
through generate() (the torch twin, BF16), the policy loss through the TE blocks in FP8, left padding as
TE's arbitrary mask. The CPU twins of these runs: tests/integrations/test_trl_peft.py."""

import json
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from yxanul.models import YxanulConfig, YxanulForCausalLM

pytestmark = [pytest.mark.gpu, pytest.mark.te]
TOKENIZER = Path(__file__).resolve().parents[2] / "yxanul" / "assets" / "tokenizer"
RECIPE = dict(use_fp8=True, require_fp8=True, fp8_recipe="delayed", fp8_margin=1, fp8_amax_history_len=16,
              fp8_min_gemm_dim=0)
TEXTS = ["ROMEO: But soft, what light through yonder window breaks?", "JULIET: O Romeo, Romeo!",
         "HAMLET: To be, or not to be, that is the question.", "KING: Now is the winter of our discontent."] * 4


@pytest.fixture
def native_te(tmp_path):
    """A small native export (every GEMM dim a multiple of 16), loaded back on the TE backend in BF16."""
    pytest.importorskip("trl", reason="needs trl (scripts/device/fetch_wheels.sh carries it)")
    from yxanul.models.configuration_yxanul import pad_vocab

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    torch.manual_seed(0)
    cfg = YxanulConfig(vocab_size=pad_vocab(len(tok)), hidden_size=256, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=512, max_position_embeddings=128,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    out = tmp_path / "native"
    YxanulForCausalLM(cfg).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), backend="te", dtype=torch.bfloat16)
    assert type(model) is YxanulForCausalLM and model.config.backend == "te"
    return model, tok


def check_readback(path) -> None:
    rep = json.loads(path.read_text())
    rb = rep["te_readback"]
    assert rep["fp8"] and rb["fp8_confirmed"] and rb["recipe"] == "DelayedScaling", rep
    assert "margin=1" in rb["recipe_repr"] and rb["fp8_modules"] == rb["fp8_modules_planned"] > 0, rb


def weights(model):
    return {k: v.detach().float().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


def test_sft_trainer_runs_the_native_te_model_in_fp8(native_te, tmp_path):
    from trl import SFTConfig

    from yxanul.integrations.trl_trainers import YxanulSFTTrainer
    from yxanul.precision import PrecisionArgs

    model, tok = native_te
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=4, per_device_train_batch_size=8,
                     learning_rate=1e-3, max_length=64, pad_to_multiple_of=16, logging_steps=1, report_to=[],
                     bf16=True, save_strategy="no", seed=0, disable_tqdm=True)
    trainer = YxanulSFTTrainer(model=model, args=args, processing_class=tok,
                               train_dataset=Dataset.from_dict({"text": TEXTS}), precision=PrecisionArgs(**RECIPE))
    before = weights(trainer.model)
    trainer.train()
    assert trainer.accelerator.mixed_precision == "fp8"
    check_readback(tmp_path / "sft" / "precision_report.json")
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    after = weights(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_grpo_trainer_runs_the_native_te_model_in_fp8(native_te, tmp_path):
    from trl import GRPOConfig

    from yxanul.integrations.trl_trainers import YxanulGRPOTrainer
    from yxanul.precision import PrecisionArgs

    def reward_len(completions, **kwargs):
        return [-abs(8 - len(c)) / 8 for c in completions]

    model, tok = native_te
    prompts = Dataset.from_dict({"prompt": ["ROMEO:", "To be, or not", "O", "Now is the winter of"] * 2})
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=2, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=16, pad_to_multiple_of=16, learning_rate=1e-3,
                      logging_steps=1, report_to=[], bf16=True, save_strategy="no", seed=0, disable_tqdm=True)
    trainer = YxanulGRPOTrainer(model=model, reward_funcs=reward_len, args=args, processing_class=tok,
                                train_dataset=prompts, precision=PrecisionArgs(**RECIPE))
    trainer.train()
    check_readback(tmp_path / "grpo" / "precision_report.json")
    logs = [r for r in trainer.state.log_history if "reward" in r]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in logs)


def test_lora_sft_on_the_te_blocks_in_fp8(native_te, tmp_path):
    """PEFT's parameter adapters (`LORA_TARGET_PARAMETERS`) on the TE blocks under the FP8 plan: TE reports the
    recipe, only the adapters move, and the merged model gives the adapted logits (BF16 tolerance)."""
    peft = pytest.importorskip("peft", reason="needs peft (scripts/device/fetch_wheels.sh carries it)")
    from trl import SFTConfig

    from yxanul.integrations.trl_trainers import YxanulSFTTrainer
    from yxanul.models import LORA_TARGET_PARAMETERS
    from yxanul.precision import PrecisionArgs

    model, tok = native_te
    args = SFTConfig(output_dir=str(tmp_path / "lora"), max_steps=4, per_device_train_batch_size=8,
                     learning_rate=1e-3, max_length=64, pad_to_multiple_of=16, logging_steps=1, report_to=[],
                     bf16=True, save_strategy="no", seed=0, disable_tqdm=True)
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=[], target_parameters=LORA_TARGET_PARAMETERS)
    trainer = YxanulSFTTrainer(model=model, args=args, processing_class=tok, peft_config=lora,
                               train_dataset=Dataset.from_dict({"text": TEXTS}), precision=PrecisionArgs(**RECIPE))
    before = weights(trainer.model)
    trainer.train()
    check_readback(tmp_path / "lora" / "precision_report.json")
    moved = [k for k, v in weights(trainer.model).items() if not torch.equal(before[k], v)]
    assert moved and all("lora_" in k for k in moved), moved
    peft_model = trainer.model.eval()
    ids = tok(" ".join(TEXTS), return_tensors="pt").input_ids[:, :32].cuda()  # BF16 forwards: any length
    with torch.no_grad():
        adapted = peft_model(input_ids=ids).logits.float()
        merged = peft_model.merge_and_unload()(input_ids=ids).logits.float()
    torch.testing.assert_close(merged, adapted, atol=5e-2, rtol=5e-2)
