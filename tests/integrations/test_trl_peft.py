"""Third-party trainers on the native model (torch backend, CPU): TRL's SFTTrainer and GRPOTrainer load it
BY PATH (TRL's create_model_from_path: `import yxanul` registered the type; the config's empty auto_map
says "no remote code") and train it; LoRA (PEFT) on the native weights under SFT, and through the Llama export."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from yxanul.models import YxanulConfig, YxanulForCausalLM

TOKENIZER = Path(__file__).resolve().parents[2] / "yxanul" / "assets" / "tokenizer"


@pytest.fixture
def native_dir(tmp_path):
    """A tiny native model + the bundled tokenizer, saved as `yxanul export --format yxanul` writes them."""
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    cfg = YxanulConfig(vocab_size=8192, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=128, max_position_embeddings=64, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    out = tmp_path / "native"
    YxanulForCausalLM(cfg).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def changed(before, model):
    return [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]


def test_sft_trainer_trains_the_native_model_by_path(native_dir, tmp_path):
    from trl import SFTConfig, SFTTrainer

    texts = ["ROMEO: But soft, what light through yonder window breaks?", "JULIET: O Romeo, Romeo!",
             "HAMLET: To be, or not to be.", "KING: Now is the winter of our discontent."] * 2
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                     max_length=24, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0)
    trainer = SFTTrainer(model=str(native_dir), args=args, train_dataset=Dataset.from_dict({"text": texts}))
    assert type(trainer.model) is YxanulForCausalLM
    before = weights(trainer.model)
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert "model.layers.0.self_attention.layernorm_qkv.query_weight" in changed(before, trainer.model)


@pytest.mark.parametrize("trainer_cls", ["SFTTrainer", "YxanulSFTTrainer"])
def test_sft_trainer_trains_lora_adapters_on_the_native_model(native_dir, tmp_path, trainer_cls):
    """TRL's `peft_config=` with the native weights as LoRA targets: the adapters learn, the base stays. Also under
    yxanul's precision plan, which sees through PEFT's wrappers (before, its module check called them replaced)."""
    from peft import LoraConfig, PeftModel
    from trl import SFTConfig, SFTTrainer

    from yxanul.integrations import YxanulSFTTrainer
    from yxanul.models import LORA_TARGET_PARAMETERS
    from yxanul.precision import PrecisionArgs

    texts = ["ROMEO: But soft, what light through yonder window breaks?", "JULIET: O Romeo, Romeo!"] * 4
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                     max_length=24, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=[], target_parameters=LORA_TARGET_PARAMETERS)
    data = Dataset.from_dict({"text": texts})
    if trainer_cls == "SFTTrainer":
        trainer = SFTTrainer(model=str(native_dir), args=args, train_dataset=data, peft_config=lora)
    else:
        model = YxanulForCausalLM.from_pretrained(str(native_dir))
        trainer = YxanulSFTTrainer(model=model, args=args, train_dataset=data, peft_config=lora,
                                   precision=PrecisionArgs())
    assert isinstance(trainer.model, PeftModel)
    before = weights(trainer.model)
    trainer.train()
    moved = changed(before, trainer.model)
    assert moved and all("lora_" in k for k in moved)  # only adapters train
    projections = [n for n, w in trainer.model.named_parameters() if w.dim() == 2 and ".layers." in n
                   and "lora_" not in n]  # q k v o fc1 fc2, each as its adapter's base_layer
    assert len(projections) == 6 * 2 and sum(".lora_B." in k for k in moved) == len(projections)  # all adapted


def test_grpo_trainer_trains_the_native_model_by_path(native_dir, tmp_path):
    """GRPO's rollouts are left-padded batches: the mask must be honoured for the log-probs to be right."""
    from trl import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(8 - len(c)) / 8 for c in completions]

    prompts = Dataset.from_dict({"prompt": ["ROMEO:", "To be, or not", "O", "Now is the winter of"]})
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=2, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=6, learning_rate=1e-2, logging_steps=1,
                      report_to=[], use_cpu=True, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=str(native_dir), reward_funcs=reward_len, args=args, train_dataset=prompts)
    assert type(trainer.model) is YxanulForCausalLM
    before = weights(trainer.model)
    trainer.train()
    logs = [r for r in trainer.state.log_history if "reward" in r]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in logs)
    assert changed(before, trainer.model)


def test_lora_on_the_native_model_trains_saves_reloads_and_merges(native_dir, tmp_path):
    """LoRA on the native model, no Llama export: adapters on its fused weights by parameter name
    (`LORA_TARGET_PARAMETERS`). They train; the saved adapter on a fresh base gives the adapted logits; merged
    and saved, the model loads back with the native names (what `--init_from` reads) and the adapted logits."""
    import peft
    from transformers import AutoModelForCausalLM

    from yxanul.models import LORA_TARGET_PARAMETERS

    base = AutoModelForCausalLM.from_pretrained(str(native_dir))
    names = set(base.state_dict())
    projections = {n for n, w in base.named_parameters() if w.dim() == 2 and ".layers." in n}  # q k v o fc1 fc2
    x = torch.randint(0, 8192, (2, 16))
    with torch.no_grad():
        ref = base(input_ids=x).logits.clone()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=[], target_parameters=LORA_TARGET_PARAMETERS)
    model = peft.get_peft_model(base, config)
    adapted = {f"{n.split('base_model.model.', 1)[1].replace('.base_layer', '')}.{m.parameter_name}"
               for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.ParamWrapper)}
    assert adapted == projections
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=x).logits.clone()
        assert (adapted - ref).abs().max() > 1e-3  # the adapters learned something
        model.save_pretrained(tmp_path / "adapter")
        fresh = AutoModelForCausalLM.from_pretrained(str(native_dir))
        reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter")(input_ids=x).logits
        torch.testing.assert_close(reloaded, adapted, atol=1e-5, rtol=1e-5)
        merged = model.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=x).logits, adapted, atol=1e-4, rtol=1e-4)
        assert set(merged.state_dict()) == names  # the native model again, no adapter left
        merged.save_pretrained(tmp_path / "merged")
        back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))(input_ids=x).logits
    torch.testing.assert_close(back, adapted, atol=1e-4, rtol=1e-4)


def test_lora_through_the_llama_export_trains_merges_and_comes_back(tmp_path):
    """LoRA the other way, for tools that want nn.Linear targets: on the Llama export a few steps move the adapter,
    merge_and_unload keeps the adapted model's logits, and the merged folder reads back into yxanul (`--init_from`'s
    path) with the same logits."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from yxanul.hub.export import read_weights_any, save_llama

    torch.manual_seed(0)
    cfg = YxanulConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, intermediate_size=128, max_position_embeddings=32)
    (tmp_path / "llama").mkdir()
    save_llama(YxanulForCausalLM(cfg), tmp_path / "llama", torch.float32, "5GB")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tmp_path / "llama")),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"]))
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(5):
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        adapted = model(ids).logits
        merged = model.merge_and_unload()
        torch.testing.assert_close(merged(ids).logits, adapted, rtol=0, atol=1e-5)  # fp32, W + BA folded once
    merged.save_pretrained(str(tmp_path / "merged"))
    back = YxanulForCausalLM(cfg).eval()
    back.load_state_dict(read_weights_any(tmp_path / "merged"), strict=False)
    back.tie_weights()
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, adapted, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["sft", "grpo"])
def test_trl_trainers_with_the_precision_plan(native_dir, tmp_path, kind):
    """YxanulSFTTrainer / YxanulGRPOTrainer: TRL's trainer under yxanul's precision plan (the FP8 path on a
    GPU with TE; on a CPU the plan resolves to FP32 and the composition itself is what is tested)."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, SFTConfig

    from yxanul.integrations import YxanulGRPOTrainer, YxanulSFTTrainer
    from yxanul.precision import PrecisionArgs

    model = AutoModelForCausalLM.from_pretrained(str(native_dir))
    common = dict(output_dir=str(tmp_path / kind), max_steps=1, per_device_train_batch_size=2, learning_rate=1e-2,
                  report_to=[], use_cpu=True, save_strategy="no", seed=0)
    if kind == "sft":
        trainer = YxanulSFTTrainer(model=model, args=SFTConfig(max_length=16, **common), precision=PrecisionArgs(),
                                   train_dataset=Dataset.from_dict({"text": ["ROMEO: But soft!", "JULIET: O Romeo!"]}))
    else:
        trainer = YxanulGRPOTrainer(model=model, args=GRPOConfig(num_generations=2, max_completion_length=4, **common),
                                    reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                                    train_dataset=Dataset.from_dict({"prompt": ["ROMEO:", "O"]}),
                                    precision=PrecisionArgs())
    before = weights(model)
    trainer.train()
    assert trainer.plan is not None and changed(before, trainer.model)
