"""The model's loss (yxanul/models/loss.py) on real code paths: penalties against their formulas on
known logits, λ = 0 identity, float64 gradchecks, the chunked linear+CE against fp32
F.cross_entropy (loss and gradients, ignore_index, Trainer's num_items_in_batch), config errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from yxanul.errors import ConfigError
from yxanul.models import YxanulForCausalLM
from yxanul.models.args import ModelArgs
from yxanul.models.loss import chunked_loss, loss_from_logits

KNOWN = torch.tensor([[2.0, 0.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0], [-3.0, 4.0, 1.0, 1.0]])  # (N=3, V=4)
TARGETS = torch.tensor([0, -100, 2])                                                         # middle ignored


def lse_py(row):
    return math.log(sum(math.exp(v) for v in row))


@pytest.mark.parametrize("impl", ["default", "chunked"])
@pytest.mark.parametrize("kind", ["z_loss", "max_z_loss"])
def test_penalty_values_match_the_formula_on_known_logits(impl, kind):
    lam = 0.25
    rows = [KNOWN[0].tolist(), KNOWN[2].tolist()]                        # the two non-ignored targets
    ce = [lse_py(rows[0]) - 2.0, lse_py(rows[1]) - 1.0]
    term = [lse_py(r) for r in rows] if kind == "z_loss" else [max(r) for r in rows]
    want_pen = lam * sum(v * v for v in term) / 2                         # mean over non-ignored positions
    if impl == "default":
        loss, lm, pen = loss_from_logits(KNOWN, TARGETS, kind, lam)
    else:  # logits = h @ I: the chunked path sees the same logits through its own matmul
        loss, lm, pen = chunked_loss(KNOWN, torch.eye(4), TARGETS, kind, lam, chunk=2)
    assert lm.item() == pytest.approx(sum(ce) / 2, abs=1e-6)
    assert pen.item() == pytest.approx(want_pen, abs=1e-6)
    assert loss.item() == pytest.approx(sum(ce) / 2 + want_pen, abs=1e-6)


@pytest.mark.parametrize("kind", ["z_loss", "max_z_loss"])
def test_model_penalty_is_the_formula_on_its_own_logits(tiny_config, kind):
    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny_config(penalty_type=kind, penalty_weight=0.01))
    x = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(3))
    out = model(x, labels=x)
    logits = out.logits[:, :-1].detach().double()                          # positions with a target
    term = logits.logsumexp(-1) if kind == "z_loss" else logits.amax(-1)
    assert out.penalty.item() == pytest.approx(0.01 * term.pow(2).mean().item(), rel=1e-5)
    assert out.lm_loss.item() == pytest.approx(F.cross_entropy(logits.reshape(-1, 1024), x[:, 1:].reshape(-1)).item(),
                                               abs=1e-5)
    assert torch.equal(out.loss, out.lm_loss + out.penalty)


@pytest.mark.parametrize("impl", ["default", "chunked"])
@pytest.mark.parametrize("kind", ["z_loss", "max_z_loss"])
def test_zero_weight_is_identical_to_no_penalty(tiny_config, impl, kind):
    x = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(4))
    grads, losses = [], []
    for pt in ("none", kind):
        torch.manual_seed(0)
        model = YxanulForCausalLM(tiny_config(penalty_type=pt, penalty_weight=0.0, loss_impl=impl))
        out = model(x, labels=x, return_logits=False)
        out.loss.backward()
        losses.append((out.loss, out.lm_loss, out.penalty))
        grads.append([p.grad for p in model.parameters()])
    (a, a_lm, a_pen), (b, b_lm, b_pen) = losses
    assert torch.equal(a, b) and torch.equal(a_lm, b_lm) and a_pen.item() == b_pen.item() == 0.0
    assert all(torch.equal(g, h) for g, h in zip(*grads))


def test_default_loss_is_transformers_cross_entropy_bit_for_bit(tiny_config):
    """penalty none -> model.loss_function (ForCausalLMLoss); with a penalty the log_softmax+nll path:
    both equal yxanul's historic F.cross_entropy(logits.float()) exactly."""
    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny_config())
    x = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(5))
    y = x.clone()
    y[0, :5] = -100
    out = model(x, shift_labels=y)
    ref = F.cross_entropy(out.logits.float().view(-1, 1024), y.view(-1), ignore_index=-100)
    assert torch.equal(out.loss, ref)
    assert torch.equal(loss_from_logits(out.logits, y, "z_loss", 0.0)[1], ref)


@pytest.mark.parametrize("kind", ["none", "z_loss", "max_z_loss"])
def test_gradcheck_float64(kind):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    h = torch.randn(5, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(7, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    t = torch.tensor([1, -100, 6, 0, 3])
    assert torch.autograd.gradcheck(lambda z: loss_from_logits(z, t, kind, 0.3)[0], (logits,))
    assert torch.autograd.gradcheck(lambda a, b: chunked_loss(a, b, t, kind, 0.3, chunk=2)[0], (h, w))


@pytest.mark.parametrize("kind", ["none", "z_loss"])
def test_chunked_equals_full_cross_entropy_in_fp32(kind):
    """Same loss (<= 1e-4) and gradients as F.cross_entropy over F.linear logits, ignore_index kept,
    with a chunk size that does not divide the token count."""
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(2, 37, 64, generator=gen, requires_grad=True)
    w = (0.2 * torch.randn(300, 64, generator=gen)).requires_grad_()
    t = torch.randint(0, 300, (2, 37), generator=gen)
    t[1, 3:9] = -100
    logits = F.linear(h, w).reshape(-1, 300)
    ref = F.cross_entropy(logits, t.reshape(-1))
    if kind == "z_loss":
        ref = ref + 0.1 * logits.logsumexp(-1)[t.reshape(-1) != -100].pow(2).mean()
    ref_gh, ref_gw = torch.autograd.grad(ref, (h, w))
    loss, lm, pen = chunked_loss(h, w, t, kind, 0.1, chunk=10)
    gh, gw = torch.autograd.grad(loss, (h, w))
    assert abs(loss.item() - ref.item()) <= 1e-4 and not lm.requires_grad
    torch.testing.assert_close(gh, ref_gh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("penalty", ["z_loss", "none"])  # none: transformers' own loss_function path
@pytest.mark.parametrize("impl", ["default", "chunked"])
def test_num_items_in_batch_normalises_like_transformers_trainer(tiny_config, impl, penalty):
    """Gradient accumulation under Trainer: each micro-batch's loss is sum / (valid targets of the whole
    step), so the accumulated loss is the mean over the step whatever each micro-batch holds."""
    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny_config(loss_impl=impl, penalty_type=penalty, penalty_weight=1e-3))
    gen = torch.Generator().manual_seed(6)
    x = torch.randint(0, 1000, (2, 12), generator=gen)
    y = torch.randint(0, 1000, (2, 12), generator=gen)
    y[1, :9] = -100                                                     # unequal micro-batches
    n = (y != -100).sum()
    with torch.no_grad():
        whole = model(x, shift_labels=y)
        parts = [model(x[i:i + 1], shift_labels=y[i:i + 1], num_items_in_batch=n) for i in range(2)]
    for field in ("loss", "lm_loss", "penalty") if penalty != "none" else ("loss",):
        assert sum(getattr(p, field) for p in parts).item() == pytest.approx(getattr(whole, field).item(), rel=1e-5)


def test_chunked_model_matches_default_model(tiny_config):
    """Same weights, tied head: the chunked loss gives the default loss and grads (no logits returned)."""
    x = torch.randint(0, 1000, (2, 20), generator=torch.Generator().manual_seed(7))
    runs = []
    for impl in ("default", "chunked"):
        torch.manual_seed(0)
        model = YxanulForCausalLM(tiny_config(loss_impl=impl))
        out = model(x, labels=x, return_logits=False)
        out.loss.backward()
        runs.append((out.loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    (la, ga), (lb, gb) = runs
    assert abs(la - lb) <= 1e-4
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], rtol=1e-3, atol=1e-6, msg=n)


def test_chunked_under_bf16_autocast_tracks_the_default(tiny_config):
    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny_config())
    x = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(8))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        h = model.model(x).last_hidden_state
        default = loss_from_logits(model.lm_head(h)[:, :-1], x[:, 1:])[0]
        chunked = chunked_loss(h[:, :-1], model.lm_head.weight, x[:, 1:])[0]
    assert h.dtype == torch.bfloat16 and abs(default.item() - chunked.item()) < 1e-3


def test_penalty_and_loss_settings_are_validated():
    for kw, key in [(dict(penalty_type="l2"), "penalty_type"), (dict(penalty_weight=-0.1), "penalty_weight"),
                    (dict(penalty_weight=True), "penalty_weight"),
                    (dict(penalty_weight=float("nan")), "penalty_weight"),
                    (dict(loss_impl="fused"), "loss_impl")]:
        with pytest.raises(ConfigError, match=key):
            ModelArgs(**kw)
    assert ModelArgs(penalty_weight=1, penalty_type="z_loss").penalty_weight == 1.0  # an int weight is a float


def test_bad_values_in_the_hf_config_and_te_loss_without_cuda(tiny_config):
    with pytest.raises(ConfigError, match="penalty_weight"):
        tiny_config(penalty_weight=-1.0)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="loss_impl"):
            YxanulForCausalLM(tiny_config(loss_impl="te"))


@pytest.mark.gpu
@pytest.mark.te
@pytest.mark.parametrize("kind", ["none", "z_loss", "max_z_loss"])
def test_te_parallel_cross_entropy_matches_fp32_reference(kind):
    from yxanul import _te
    from yxanul.models.loss import te_loss

    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(2, 64, 50304, device="cuda", generator=gen).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, 50304, (2, 64), device="cuda", generator=gen)
    t[0, :7] = -100
    ref, ref_lm, ref_pen = loss_from_logits(logits, t, kind, 1e-3)
    ref_g, = torch.autograd.grad(ref, logits)
    loss, lm, pen = te_loss(logits.clone(), t, _te.parallel_cross_entropy, kind, 1e-3)
    leaf = logits.detach().clone().requires_grad_()
    g, = torch.autograd.grad(te_loss(leaf * 1, t, _te.parallel_cross_entropy, kind, 1e-3)[0], leaf)
    assert abs(loss.item() - ref.item()) <= 1e-4 and abs(pen.item() - ref_pen.item()) <= 1e-4
    torch.testing.assert_close(g.float(), ref_g.float(), rtol=1e-2, atol=1e-5)


@pytest.mark.parametrize("impl,kind", [("default", "none"), ("default", "z_loss"), ("chunked", "none")])
def test_loader_windows_are_sliced_targets(tiny_config, impl, kind):
    """The loader's x, y are slices of one (B, T+1) window: y is not contiguous, every path takes it."""
    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny_config(loss_impl=impl, penalty_type=kind))
    w = torch.randint(0, 1000, (2, 17), generator=torch.Generator().manual_seed(9))
    x, y = w[:, :-1], w[:, 1:]
    assert not y.is_contiguous()
    with torch.no_grad():
        assert torch.equal(model(x, shift_labels=y).loss, model(x, shift_labels=y.contiguous()).loss)
