"""`yxanul.hub.loading`: a PEFT adapter folder is a MODEL (its local base, the adapter merged in) for
generate, eval and export, whose merged folder --init_from reads; pushed as it is; a base that is not here is one
line."""

import json

import pytest
import torch

from hub.helpers import RecordingHfApi
from yxanul.cli import main as cli
from yxanul.errors import UserError
from yxanul.hub.export import export
from yxanul.hub.loading import load_model
from yxanul.hub.push import main as push_main

peft = pytest.importorskip("peft")
PROMPT = "ROMEO:"


@pytest.fixture
def adapter(tok_run, tmp_path):
    """(adapter folder, its base export, the adapted logits of ``ids``, ids): LoRA on the native weights with
    non-zero B (what training leaves), saved by PEFT."""
    from yxanul.models import LORA_TARGET_PARAMETERS

    run, _ = tok_run
    base_dir = export(run, tmp_path / "base", fmt="yxanul", dtype="fp32")
    base, _ = load_model(base_dir)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=[],
                                                      target_parameters=LORA_TARGET_PARAMETERS))
    gen = torch.Generator().manual_seed(0)
    for name, p in model.named_parameters():
        if ".lora_B." in name:
            p.data = torch.randn(p.shape, generator=gen) * 0.05
    ids = torch.randint(0, 8192, (2, 16), generator=gen)
    with torch.no_grad():
        want = model(input_ids=ids).logits.clone()
    model.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter", base_dir, want, ids


def test_an_adapter_folder_loads_merged_and_feeds_generate_export_and_init_from(adapter, tmp_path, capsys):
    path, base_dir, want, ids = adapter
    assert json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base_dir)
    model, tok = load_model(path)
    assert tok is not None and not any(n for n, _ in model.named_modules() if "lora" in n)  # merged: a plain model
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)
    assert cli(["generate", str(path), "--prompt", PROMPT, "--max_new_tokens", "4", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith(PROMPT)
    llama = export(path, tmp_path / "llama", dtype="fp32")  # the merged model, for plain transformers
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(str(llama))(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    from yxanul.models.build import load_weights

    with pytest.raises(UserError, match="a PEFT adapter, not a model; merge it into its base first: `yxanul export"):
        load_weights(model, str(path))  # --init_from: the adapter alone is no model
    merged = export(path, tmp_path / "merged", fmt="yxanul", dtype="fp32")  # what that line says to do
    fresh = load_model(base_dir)[0]
    load_weights(fresh, str(merged))
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)


def test_an_adapter_whose_base_is_not_here_is_one_line(adapter, tmp_path, capsys):
    path, base_dir, _, _ = adapter
    base_dir.rename(tmp_path / "moved")
    with pytest.raises(UserError, match="the adapter's base model '.*' is not a folder here"):
        load_model(path)
    assert cli(["generate", str(path), "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: MODEL '{path}': the adapter's base model")
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(path)}))
    with pytest.raises(UserError, match="is another adapter; merge that one into its own base first"):
        load_model(path)  # itself as its base: one line, not a recursion without end


def test_push_uploads_an_adapter_folder_as_it_is(adapter):
    """As PEFT's own push_to_hub: the adapter's files (adapter_config.json, adapter_model.safetensors, its card)."""
    path = adapter[0]
    api = RecordingHfApi()
    assert push_main([str(path), "--hub_model_id", "me/lora"], api=api) == 0
    (up,) = api.uploads()
    assert set(up["files"]) == {f.name for f in path.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
