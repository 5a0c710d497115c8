"""The transformers model interface of the native model (torch backend): registration with the Auto
classes, padding masks (left and right, forward and generate), position ids from the mask, SDPA vs eager,
hidden states, inputs_embeds, tuples. Tolerances: fp32 attention over <= 16 keys, where a different
kernel (masked SDPA vs is_causal, eager's fp32 softmax) reorders sums: ~1e-6, so 1e-5."""

import subprocess
import sys

import pytest
import torch

from yxanul.errors import ConfigError
from yxanul.models import YxanulForCausalLM

CLOSE = dict(rtol=0, atol=1e-5)
PROMPTS = [[5, 17, 300, 999, 42, 7, 7, 128], [64, 900, 3], [11, 12, 13, 14, 15]]
PAD = 1023


def model_of(tiny_config, attn=None, seed=0):
    torch.manual_seed(seed)
    kw = {} if attn is None else {"attn_implementation": attn}
    return YxanulForCausalLM(tiny_config(num_key_value_heads=2, **kw)).eval()  # GQA: the repeat path too


def padded(prompts, side="left"):
    T = max(map(len, prompts))
    ids = torch.full((len(prompts), T), PAD)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        sl = slice(T - len(p), T) if side == "left" else slice(0, len(p))
        ids[i, sl], mask[i, sl] = torch.tensor(p), 1
    return ids, mask


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_each_prompt_alone(tiny_config, attn, side):
    model = model_of(tiny_config, attn)
    ids, mask = padded(PROMPTS, side)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).logits
        for i, p in enumerate(PROMPTS):
            alone = model(torch.tensor([p])).logits[0]                 # (len, V)
            real = mask[i].bool()
            torch.testing.assert_close(batch[i][real], alone, **CLOSE)


def test_sdpa_and_eager_give_the_same_logits(tiny_config):
    sdpa, eager = model_of(tiny_config, "sdpa"), model_of(tiny_config, "eager")
    ids, mask = padded(PROMPTS)
    with torch.no_grad():
        torch.testing.assert_close(eager(ids).logits, sdpa(ids).logits, **CLOSE)
        got, want = eager(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **CLOSE)
    sdpa.set_attn_implementation("eager")  # switched after building: read at call time
    with torch.no_grad():
        torch.testing.assert_close(sdpa(ids).logits, eager(ids).logits, rtol=0, atol=0)


def test_mask_without_padding_takes_the_training_path_bit_for_bit(tiny_config):
    model = model_of(tiny_config)
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]])
    with torch.no_grad():
        assert torch.equal(model(ids, attention_mask=torch.ones_like(ids)).logits, model(ids).logits)


def test_padded_loss_equals_the_loss_of_each_sequence(tiny_config):
    """Right padding in training (SFT collators): labels -100 at pads, gradients finite."""
    model = model_of(tiny_config).train()
    ids, mask = padded(PROMPTS, "right")
    labels = ids.masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        n = sum(len(p) - 1 for p in PROMPTS)
        total = sum(model(torch.tensor([p]), labels=torch.tensor([p])).loss * (len(p) - 1) for p in PROMPTS)
    assert out.loss.item() == pytest.approx(total.item() / n, abs=1e-5)


def test_batched_greedy_generate_equals_one_by_one(tiny_config):
    model = model_of(tiny_config)
    ids, mask = padded(PROMPTS)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=PAD, return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        batch = model.generate(ids, attention_mask=mask, **kw)
        for i, p in enumerate(PROMPTS):
            alone = model.generate(torch.tensor([p]), **kw)
            assert torch.equal(batch.sequences[i, ids.shape[1]:], alone.sequences[0, len(p):]), i
            for got, want in zip(batch.logits, alone.logits):  # every step, through the KV cache
                torch.testing.assert_close(got[i], want[0], **CLOSE)


def test_hidden_states_inputs_embeds_and_tuples(tiny_config):
    model = model_of(tiny_config)
    ids, mask = padded(PROMPTS)
    L = model.config.num_hidden_layers
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_hidden_states=True)
        base = model.model(ids, attention_mask=mask)
        emb = model(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=mask)
        as_tuple = model(ids, return_dict=False)
    assert len(out.hidden_states) == L + 1
    assert torch.equal(out.hidden_states[0], model.get_input_embeddings()(ids))
    assert torch.equal(out.hidden_states[-1], base.last_hidden_state)
    assert torch.equal(emb.logits, out.logits)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], model(ids).logits)
    with torch.no_grad():  # with labels, Llama's order: (loss, logits, cache, ...), so [0] is the loss
        with_loss, as_dict = model(ids, labels=ids, return_dict=False), model(ids, labels=ids)
    assert torch.equal(with_loss[0], as_dict.loss) and torch.equal(with_loss[1], as_dict.logits)
    with pytest.raises(ValueError, match="exactly one"):
        model(ids, inputs_embeds=emb.logits)
    model.config.output_hidden_states = True  # as from_pretrained(..., output_hidden_states=True) sets it
    with torch.no_grad():
        assert len(model(ids, attention_mask=mask).hidden_states) == L + 1
        assert model(ids, output_hidden_states=False).hidden_states is None


def test_output_attentions_is_refused_not_silently_dropped(tiny_config):
    model = model_of(tiny_config, attn="eager")
    ids = torch.tensor([PROMPTS[0]])
    with pytest.raises(ValueError, match="output_attentions: false"):
        model(ids, output_attentions=True)
    with pytest.raises(ValueError, match="output_attentions"):
        model.generate(ids, max_new_tokens=2, output_attentions=True, return_dict_in_generate=True)


def test_explicit_position_ids_drive_rope(tiny_config):
    model = model_of(tiny_config)
    ids = torch.tensor([PROMPTS[0]])
    T = ids.shape[1]
    with torch.no_grad():
        plain = model(ids).logits
        same = model(ids, position_ids=torch.arange(T)[None]).logits
        shifted = model(ids, position_ids=torch.arange(T)[None] + 7).logits
    torch.testing.assert_close(same, plain, **CLOSE)
    torch.testing.assert_close(shifted, plain, rtol=0, atol=1e-4)  # RoPE is relative: a shift changes little
    assert not torch.equal(shifted, plain)                          # ... but the positions were used


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_documents_packed_into_one_row_do_not_see_each_other_as_in_the_llama_export(tiny_config, attn):
    """TRL's packing / padding_free: one row, position ids restarting at each document, no mask. Each document's
    logits are those it has alone, and the loss is the Llama export's on the same row (same weights)."""
    from yxanul.integrations.causal_lm import as_llama

    model = model_of(tiny_config, attn=attn)
    a, b = PROMPTS[0], PROMPTS[1]
    ids, pos = torch.tensor([a + b]), torch.tensor([list(range(len(a))) + list(range(len(b)))])
    with torch.no_grad():
        packed = model(ids, position_ids=pos).logits[0]
        torch.testing.assert_close(packed[:len(a)], model(torch.tensor([a])).logits[0], **CLOSE)
        torch.testing.assert_close(packed[len(a):], model(torch.tensor([b])).logits[0], **CLOSE)
        llama = as_llama(model).eval()(ids, position_ids=pos, labels=ids, use_cache=False).loss
        torch.testing.assert_close(model(ids, position_ids=pos, labels=ids).loss, llama, **CLOSE)
        # packed AND right-padded (a collator padding packed rows to one length): both masks hold
        ids2, mask2 = torch.tensor([a + b + [PAD, PAD]]), torch.tensor([[1] * (len(a) + len(b)) + [0, 0]])
        pos2 = torch.cat([pos, pos[:, -1:] + 1 + torch.arange(2)[None]], 1)
        both = model(ids2, attention_mask=mask2, position_ids=pos2).logits[0, len(a):len(a) + len(b)]
        torch.testing.assert_close(both, packed[len(a):], **CLOSE)


def test_use_cache_is_a_config_key_as_in_llama(tiny_config, tmp_path):
    """`from_pretrained(..., use_cache=False)` (TRL's model_init_kwargs) sets the config's key instead of reaching
    the model's constructor; generate() then runs without a cache, to the same tokens."""
    from transformers import AutoModelForCausalLM

    model = model_of(tiny_config)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, use_cache=False)
    assert model.config.use_cache is True and loaded.config.use_cache is False
    ids = torch.tensor([PROMPTS[0]])
    assert torch.equal(loaded.generate(ids, max_new_tokens=5, do_sample=False),
                       model.generate(ids, max_new_tokens=5, do_sample=False))


def test_attn_implementations(tiny_config):
    assert YxanulForCausalLM(tiny_config()).config._attn_implementation == "sdpa"
    assert YxanulForCausalLM(tiny_config(attn_implementation="eager")).config._attn_implementation == "eager"
    with pytest.raises((ConfigError, ValueError), match="attn_implementation|flex_attention"):
        YxanulForCausalLM(tiny_config(attn_implementation="flex_attention"))


def test_import_yxanul_registers_with_the_auto_classes(tmp_path, tiny_config):
    """A fresh process: `import yxanul` (transformers NOT imported by it) is all a user needs, in either
    import order, for AutoConfig.for_model, AutoModel and AutoModelForCausalLM.from_pretrained."""
    model_of(tiny_config).save_pretrained(tmp_path / "m")
    script = """
import sys
{first}
assert "torch" not in sys.modules or "{first}".startswith("import transformers"), "import yxanul pulled torch in"
{second}
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
c = AutoConfig.for_model("yxanul", hidden_size=64, num_attention_heads=2, num_hidden_layers=1, intermediate_size=64)
assert type(AutoModel.from_config(c)).__name__ == "YxanulModel"
m = AutoModelForCausalLM.from_pretrained(sys.argv[1])
print(type(m).__name__, type(c).__name__)
"""
    for first, second in (("import yxanul", "import transformers"), ("import transformers", "import yxanul")):
        code = script.format(first=first, second=second)
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split()[-2:] == ["YxanulForCausalLM", "YxanulConfig"]


def test_positions_from_a_mask_are_those_of_the_last_tokens_after_a_cache():
    """With a KV cache and no position_ids, the T new tokens' positions come from the (B, S) mask: each row counts
    from 0 at its first real token, and the new tokens are the mask's last T columns."""
    from yxanul.models.masking import position_ids_from_mask

    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])  # S = 6: a left-padded row
    assert position_ids_from_mask(mask, 6).tolist() == [[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    assert position_ids_from_mask(mask, 2).tolist() == [[2, 3], [4, 5]]  # 4 cached, 2 new
