"""Generation through transformers' GenerationMixin with a real KV cache (DynamicCache), on the
torch backend (CPU, fp32): cache == no-cache token for token, one (B, 1) forward per new token, only
the last position's logits, RoPE offsets, the eval-sample settings, and the TE backend's torch twin."""

import pytest
import torch
from transformers import DynamicCache, StaticCache

from yxanul.models import YxanulForCausalLM
from yxanul.models.modeling_yxanul import torch_twin


def ids(B=2, T=5, seed=1):
    return torch.randint(0, 1000, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def model(tiny_config):
    torch.manual_seed(0)
    return YxanulForCausalLM(tiny_config()).eval()


def greedy_without_cache(model, x, n):
    """The reference: re-run the whole prefix and take the argmax of the last position."""
    seq = x
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return seq


def record_forwards(model):
    """Each forward's (input_ids shape, logits shape, cache length before the call)."""
    calls = []

    def pre(mod, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        calls.append([tuple(kwargs["input_ids"].shape), cache.get_seq_length() if cache is not None else None])

    def post(mod, args, kwargs, out):
        calls[-1].append(tuple(out.logits.shape))

    return calls, [model.register_forward_pre_hook(pre, with_kwargs=True),
                   model.register_forward_hook(post, with_kwargs=True)]


def test_greedy_with_cache_equals_the_no_cache_argmax_loop(model):
    x = ids(2, 5)
    calls, hooks = record_forwards(model)
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False, pad_token_id=0)
    for h in hooks:
        h.remove()
    assert torch.equal(out, greedy_without_cache(model, x, 12))
    # one prefill over the prompt, then ONE forward per new token on (B, 1) inputs against a growing
    # cache, and only the last position's logits each time (logits_to_keep=1)
    V = model.config.vocab_size
    assert calls[0] == [(2, 5), 0, (2, 1, V)]
    assert calls[1:] == [[(2, 1), 5 + i, (2, 1, V)] for i in range(11)]


def test_cache_forward_equals_full_forward_at_every_position(model, tiny_config):
    """Prefill 7 tokens, then 1, then a chunk of 3 (the causal mask with an offset): each call's
    logits equal the full-sequence forward's at the same positions. GQA config (4 heads, 2 kv)."""
    x = ids(2, 11)
    with torch.no_grad():
        full = model(x).logits
        cache = DynamicCache(config=model.config)
        parts = [model(x[:, a:b], cache=cache, use_cache=True).logits for a, b in ((0, 7), (7, 8), (8, 11))]
    assert cache.get_seq_length() == 11
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=2e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_static_cache_attends_only_to_its_filled_slots(model, attn):
    """A StaticCache hands every one of its max_cache_len slots to attention, unfilled ones as zeros: the
    chunked forwards equal the full one, and generate(cache_implementation="static") (which asks the
    model for its masks) gives the dynamic cache's tokens, a left-padded batch included."""
    model.config._attn_implementation = attn
    x = ids(2, 11)
    with torch.no_grad():
        full = model(x).logits
        cache = StaticCache(config=model.config, max_cache_len=32)
        parts = [model(x[:, a:b], cache=cache, use_cache=True).logits for a, b in ((0, 7), (7, 8), (8, 11))]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=2e-5)
    mask = torch.ones_like(x)
    mask[1, :4] = 0  # row 1 left-padded
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    dynamic = model.generate(x, **kw)
    assert torch.equal(model.generate(x, cache_implementation="static", **kw), dynamic)


def test_logits_to_keep(model):
    x = ids(2, 9)
    with torch.no_grad():
        full = model(x).logits
        # fp32's own tolerance (torch's float32 defaults, rtol 1.3e-6 + atol 1e-5): the sliced head GEMM has
        # another M, so BLAS may pick another blocking and summation order; a wrong position is off by O(1)
        close = dict(rtol=1.3e-6, atol=1e-5)
        torch.testing.assert_close(model(x, logits_to_keep=1).logits, full[:, -1:], **close)
        torch.testing.assert_close(model(x, logits_to_keep=3).logits, full[:, -3:], **close)
        torch.testing.assert_close(model(x, logits_to_keep=torch.tensor([0, 4])).logits, full[:, [0, 4]], **close)


def test_sampling_with_the_eval_sample_settings_is_reproducible_and_cached(model):
    """The trainer's sample: do_sample, top_k=50, temperature=0.8, seeded. Same seed, same tokens;
    the cached run draws exactly what the no-cache sampler draws from the same distributions."""
    x = ids(1, 4)
    kw = dict(max_new_tokens=16, do_sample=True, top_k=50, temperature=0.8, pad_token_id=0)
    torch.manual_seed(0)
    a = model.generate(x, **kw)
    torch.manual_seed(0)
    b = model.generate(x, **kw)
    torch.manual_seed(0)
    c = model.generate(x, use_cache=False, **kw)
    assert torch.equal(a, b) and a.shape == (1, 20)
    assert torch.equal(a, c)
    torch.manual_seed(1)
    assert not torch.equal(model.generate(x, **kw), a)   # it does sample


def test_generate_past_the_training_length_continues_rope_positions(tiny_config):
    """Like transformers' Llama, positions past max_position_embeddings extrapolate RoPE (no silent
    cropping): cache == no-cache still holds."""
    model = YxanulForCausalLM(tiny_config(max_position_embeddings=8)).eval()
    x = ids(1, 6)
    out = model.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 12) and torch.equal(out, greedy_without_cache(model, x, 6))


def test_training_forward_builds_no_cache(model):
    """A training forward builds no KV cache: by default, and under activation checkpointing even
    when asked to (use_cache=True), as transformers' checkpointed layers do: the recomputation in
    backward would append every key twice. The loss and gradients are those of the plain forward."""
    def cache_of(out):  # `cache` on transformers 5.24, `past_key_values` before (an empty cache is falsy)
        cache = getattr(out, "cache", None)
        return cache if cache is not None else getattr(out, "past_key_values", None)

    x = ids(2, 8)
    assert cache_of(model(x, use_cache=True)).get_seq_length() == 8   # eval: the switch does build one
    model.train()
    assert cache_of(model(x, labels=x)) is None

    def loss_and_grads(**kw):
        model.zero_grad()
        out = model(x, labels=x, **kw)
        out.loss.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters()}

    ref, ref_grads = loss_and_grads()
    model.set_activation_checkpointing(True)
    try:
        out, grads = loss_and_grads(use_cache=True)
    finally:
        model.set_activation_checkpointing(False)
    assert cache_of(out) is None
    torch.testing.assert_close(out.loss, ref.loss)   # the same fp32 ops recomputed
    torch.testing.assert_close(grads, ref_grads)


def test_torch_twin_shares_the_weights_and_generates_the_same(model):
    assert torch_twin(model) is model                        # torch backend: itself
    model.config.backend = "te"                              # what the twin sees of a TE model: names + tensors
    try:
        twin = torch_twin(model)
    finally:
        model.config.backend = "torch"
    assert twin is not model and twin.config.backend == "torch" and model.config.backend == "torch"
    mine, theirs = dict(model.named_parameters()), dict(twin.named_parameters())
    assert mine.keys() == theirs.keys()
    assert all(theirs[k].data_ptr() == p.data_ptr() for k, p in mine.items())   # no copy
    x = ids(2, 5)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(twin.generate(x, **kw), model.generate(x, **kw))
