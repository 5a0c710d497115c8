"""The two export formats side by side: the native (yxanul) export and the Llama export give the same
logits and hidden states on the same padded batch; each has its own model card whose usage snippet runs
as written; bos/eos/pad ids agree with the tokenizer. fp32, <= 16 keys: 1e-5 covers a kernel's reordering."""

import json
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from hub.helpers import random_model, save_run
from yxanul.hub.export import export
from yxanul.models import YxanulForCausalLM

CLOSE = dict(rtol=0, atol=1e-5)


def test_native_equals_llama_export_on_a_padded_batch(tmp_path):
    model = random_model(2, False, 1024, seed=3)
    save_run(model, tmp_path / "run", te_views=False)
    native = AutoModelForCausalLM.from_pretrained(str(export(tmp_path / "run", tmp_path / "yx", fmt="yxanul",
                                                             dtype="fp32"))).eval()
    llama = AutoModelForCausalLM.from_pretrained(str(export(tmp_path / "run", tmp_path / "ll", dtype="fp32"))).eval()
    assert type(native) is YxanulForCausalLM and type(llama) is LlamaForCausalLM
    ids = torch.tensor([[1000, 1000, 1000, 5, 17, 300, 999], [42, 7, 7, 128, 64, 900, 3]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    real = mask.bool()
    with torch.no_grad():
        a = native(ids, attention_mask=mask, output_hidden_states=True)
        b = llama(ids, attention_mask=mask, output_hidden_states=True)
        kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=1000)
        gen_a, gen_b = native.generate(ids, attention_mask=mask, **kw), llama.generate(ids, attention_mask=mask, **kw)
    torch.testing.assert_close(a.logits[real], b.logits[real], **CLOSE)
    assert len(a.hidden_states) == len(b.hidden_states) == model.config.num_hidden_layers + 1
    for ha, hb in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(ha[real], hb[real], **CLOSE)
    assert torch.equal(gen_a, gen_b)


def snippet(card: str) -> str:
    return re.search(r"## Use\n\n```python\n(.*?)```", card, re.S).group(1)


@pytest.mark.slow  # two exports and two fresh interpreters importing torch: ~30 s idle, minutes on a busy box
def test_each_format_has_its_own_card_whose_snippet_runs(tmp_path, tok_run):
    run, _ = tok_run
    for fmt in ("yxanul", "llama"):
        out = export(run, tmp_path / fmt, fmt=fmt)
        card = (out / "README.md").read_text()
        code = snippet(card)
        if fmt == "yxanul":
            assert "LlamaForCausalLM" not in card and "import yxanul" in code and "yxanul model type" in card.replace(
                "`yxanul` model type", "yxanul model type")
        else:
            assert "standard `LlamaForCausalLM`" in card and "yxanul" not in code
            code = "import sys; sys.modules['yxanul'] = None\n" + code  # plain transformers: yxanul unimportable
        r = subprocess.run([sys.executable, "-c", code], cwd=out, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (fmt, r.stderr[-2000:])
        assert r.stdout.startswith("ROMEO:"), r.stdout
        assert "attention mask" not in r.stderr.lower(), r.stderr[-2000:]
        cfg = json.loads((out / "config.json").read_text())
        gen = json.loads((out / "generation_config.json").read_text())
        tok = AutoTokenizer.from_pretrained(str(out))
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            assert cfg.get(key) == gen.get(key) == getattr(tok, key), (fmt, key)
        assert tok.pad_token_id is None and cfg["eos_token_id"] == tok.convert_tokens_to_ids("<|endoftext|>")
        assert tok.model_max_length == cfg["max_position_embeddings"], fmt  # truncation=True: the model's length
