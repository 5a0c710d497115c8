"""YxanulForCausalLM under transformers.Trainer on CPU: loss falls, save/reload, exact resume with TE's
q/k/v storage layout, gradient-accumulation normalisation, the FP8 fallback line and report, parity
with `yxanul train`."""


import pytest
import torch
from transformers import Trainer, TrainingArguments, set_seed

from yxanul.data.hf_dataset import ShardWindowDataset
from yxanul.models import ModelArgs, YxanulForCausalLM, build_model

PRESET = "nano"  # the 5M CPU preset: the one place to change it

T, B = 32, 4


def fuse_qkv_like_te(model):
    """Every layer's query/key/value weights become views of ONE buffer, as TE's LayerNormLinear
    (parameters_split) registers them (same helper as tests/checkpoint/test_io.py)."""
    for layer in model.model.layers:
        qkv = layer.self_attention.layernorm_qkv
        parts = [qkv.query_weight, qkv.key_weight, qkv.value_weight]
        buf, start = torch.cat([p.detach() for p in parts]), 0
        for name, p in zip(("query_weight", "key_weight", "value_weight"), parts):
            setattr(qkv, name, torch.nn.Parameter(buf[start:start + p.shape[0]]))
            start += p.shape[0]


def shares_qkv_storage(model) -> bool:
    qkv = model.model.layers[0].self_attention.layernorm_qkv
    return qkv.key_weight.untyped_storage().data_ptr() == qkv.query_weight.untyped_storage().data_ptr()


def new_model(vocab, seed=0, fused=False):
    set_seed(seed)
    model = build_model(ModelArgs(model=PRESET, seq_length=T, backend="torch"), vocab)
    if fused:
        fuse_qkv_like_te(model)
    return model


def targs(out, **kw):
    base = dict(output_dir=str(out), per_device_train_batch_size=B, learning_rate=3e-3, warmup_steps=0,
                logging_steps=1, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no",
                dataloader_num_workers=0, seed=0)
    return TrainingArguments(**{**base, **kw})


def losses(trainer) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in trainer.state.log_history if "loss" in r}


@pytest.mark.slow  # ~12 Trainer steps with gradient checkpointing, two checkpoints, a reload: 15-75 s here
def test_plain_trainer_trains_saves_reloads_and_resumes_exactly_with_te_qkv_views(small_data, tmp_path):
    """A plain Trainer (nothing yxanul-specific but the model): HF `labels`, gradient checkpointing,
    checkpoints and save_model of a model whose q/k/v are views of one buffer (TE's layout: a save
    that drops shared tensors loses key/value), resume_from_checkpoint exact, from_pretrained equal."""
    data_dir, vocab = small_data
    ds = ShardWindowDataset(data_dir, T, seed=0, targets="labels")
    args = targs(tmp_path / "a", max_steps=8, save_strategy="steps", save_steps=4, gradient_checkpointing=True)
    model = new_model(vocab, fused=True)
    assert shares_qkv_storage(model)
    full = Trainer(model=model, args=args, train_dataset=ds)
    full.train()
    a = losses(full)
    assert sorted(a) == list(range(1, 9)) and model.activation_checkpointing
    assert (a[7] + a[8]) / 2 < (a[1] + a[2]) / 2 - 0.5, a  # it learns
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "a" / "checkpoint-4" / "model.safetensors"))
    assert {"model.layers.0.self_attention.layernorm_qkv.key_weight",
            "model.layers.0.self_attention.layernorm_qkv.value_weight"} <= saved.keys()

    resumed_model = new_model(vocab, seed=1, fused=True)  # other init: everything must come from the checkpoint
    resumed = Trainer(model=resumed_model, args=targs(tmp_path / "a", max_steps=8, gradient_checkpointing=True),
                      train_dataset=ds)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-4"))
    b = {s: v for s, v in losses(resumed).items() if s > 4}  # (the history up to 4 comes from the checkpoint)
    assert sorted(b) == list(range(5, 9)) and max(abs(a[s] - b[s]) for s in b) < 1e-6, (a, b)
    assert shares_qkv_storage(resumed_model)  # loaded in place: still TE's layout
    for k, v in model.state_dict().items():
        assert torch.equal(v, resumed_model.state_dict()[k]), k

    full.save_model(str(tmp_path / "final"))
    reloaded = YxanulForCausalLM.from_pretrained(str(tmp_path / "final")).eval()
    x = ds[0]["input_ids"][None]
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x).logits, reloaded(x).logits)
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()  # tied
    # `yxanul train --init_from` takes a Trainer checkpoint (its trainer_state.json is the Trainer's, not damage)
    # and `yxanul export --overwrite` never replaces the Trainer's output folder (its checkpoints and logs)
    from yxanul.errors import UserError
    from yxanul.hub.export import export

    init = build_model(ModelArgs(model=PRESET, backend="torch", seq_length=T,
                                 init_from=str(tmp_path / "a" / "checkpoint-4")), vocab)
    for k, v in load_file(str(tmp_path / "a" / "checkpoint-4" / "model.safetensors")).items():
        assert torch.equal(v, init.state_dict()[k]), k
    with pytest.raises(UserError, match="a transformers Trainer output"):
        export(str(tmp_path / "final"), tmp_path / "a", overwrite=True)
    assert (tmp_path / "a" / "checkpoint-4" / "optimizer.pt").is_file()


class MaskSomeLabels:
    """Collator: stacks items and masks an uneven prefix of each row's labels (-100), so micro-batches
    hold different numbers of targets and only a global normalisation matches the big batch."""

    def __call__(self, items):
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        for row, it in enumerate(items):
            batch["labels"][row, :int(it["input_ids"][0]) % (T - 4)] = -100
        return batch


def test_gradient_accumulation_matches_the_big_batch(small_data, tmp_path):
    """GA=4 x micro 2 gives the loss and gradient of GA=1 x micro 8 with Trainer's own normalisation."""
    data_dir, vocab = small_data
    ds = ShardWindowDataset(data_dir, T, seed=0, targets="labels")
    runs = {}
    for ga, micro in ((1, 8), (4, 2)):
        tr = Trainer(model=new_model(vocab), train_dataset=ds, data_collator=MaskSomeLabels(),
                     args=targs(tmp_path / f"ga{ga}", max_steps=1, per_device_train_batch_size=micro,
                                gradient_accumulation_steps=ga, train_sampling_strategy="sequential",
                                max_grad_norm=1e9))  # no clipping, norm still logged
        tr.train()
        runs[ga] = tr.state.log_history[0]
    assert runs[1]["loss"] == pytest.approx(runs[4]["loss"], rel=1e-4)
    assert runs[1]["grad_norm"] == pytest.approx(runs[4]["grad_norm"], rel=1e-4)


def test_plain_trainer_evaluates_a_loss_with_a_collators_labels(tmp_path):
    """The label names Trainer derives from the forward signature are `labels` only (Llama's), so the standard
    collator's batches get an eval_loss, and load_best_model_at_end finds its metric."""
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling

    from yxanul.data.tokenizer_load import load_tokenizer

    tok = load_tokenizer(None)[1]
    tok.pad_token = tok.eos_token
    texts = [f"To be, or not to be, that is the question {i}." for i in range(16)]
    ds = Dataset.from_dict({"text": texts}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
    def accuracy(p):  # what compute_metrics code written for Llama does: the predictions are the logits alone
        hit = p.predictions.argmax(-1)[:, :-1] == p.label_ids[:, 1:]
        return {"acc": float(hit[p.label_ids[:, 1:] != -100].mean())}

    trainer = Trainer(model=new_model(len(tok)), train_dataset=ds, eval_dataset=ds,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False), compute_metrics=accuracy,
                      args=targs(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1, save_strategy="steps",
                                 save_steps=1, load_best_model_at_end=True, per_device_eval_batch_size=8))
    assert trainer.label_names == ["labels"]
    trainer.train()
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] > 0 and 0 <= metrics["eval_acc"] <= 1
    logits = trainer.predict(ds).predictions  # not a tuple with lm_loss/penalty beside the logits
    assert logits.shape[0] == len(ds) and logits.shape[-1] == trainer.model.config.vocab_size
