"""PEFT LoRA on the Llama export (the docs' "which format for which tool" row): adapters on every attention and
MLP projection train, and merging them gives the adapted model's logits."""

import pytest
import torch

from yxanul.hub.export import export

peft = pytest.importorskip("peft")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_lora_on_llama_export_trains_and_merges(tok_run, tmp_path):
    from transformers import AutoModelForCausalLM

    run, _ = tok_run
    path = export(run, tmp_path / "llama", dtype="fp32")
    base = AutoModelForCausalLM.from_pretrained(str(path))
    x = torch.randint(0, 8192, (2, 16))
    with torch.no_grad():
        ref = base(input_ids=x).logits.clone()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    n_adapted = sum(1 for n, _ in model.named_modules() if n.endswith(".lora_A"))
    assert n_adapted == len(TARGETS) * base.config.num_hidden_layers
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=x).logits
        assert (adapted - ref).abs().max() > 1e-3  # the adapters learned something
        merged = model.merge_and_unload()(input_ids=x).logits
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=1e-4)  # fp32: W + BA summed once vs twice
