"""``norm_kernel: cudnn`` on a GPU: TE's switch to cuDNN's RMSNorm kernels takes effect (no TE normalization
kernel runs, forward or backward), and the model computes and trains as with TE's own kernels, in BF16 and in
the two FP8 recipes whose norm paths differ (delayed: the norm writes FP8 itself; current scaling: TE norms in
BF16 then quantizes when cuDNN is on). TE reads the switch once per process, so each kernel runs in a child
process (this file, run as a script) with the same seed, weights and batches."""

import json
import subprocess
import sys

import pytest
import torch

from yxanul import _te

pytestmark = [
    pytest.mark.gpu, pytest.mark.te,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not _te.TE_AVAILABLE, reason=f"needs Transformer Engine ({_te.TE_IMPORT_ERROR})"),
]

PRECISIONS = ("bf16", "delayed", "current")
# xlarge's width (1920: no tuned TE kernel, the general one) in two small layers
SHAPE = dict(hidden_size=1920, num_attention_heads=15, num_key_value_heads=15, num_hidden_layers=2,
             intermediate_size=512)


def _run(kind: str, precision: str) -> dict:
    """Child: 6 training steps of the same model on the same batches; the first step profiled."""
    from yxanul.models import YxanulForCausalLM, config_from_preset
    from yxanul.precision import PrecisionArgs, resolve_precision
    from yxanul.training.optim import OptimArgs, build_optimizer
    from yxanul.training.step import train_step

    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 8192, (4, 129), generator=gen).cuda() for _ in range(2)]  # packed (B, T + 1)
    _te.reset_fp8_state()
    torch.manual_seed(0)
    config = config_from_preset("tiny", 8192, 128, backend="te", norm_kernel=kind, **SHAPE)
    model = YxanulForCausalLM(config).cuda().train()
    fp8 = precision != "bf16"
    plan = resolve_precision(PrecisionArgs(use_fp8=fp8, require_fp8=fp8, fp8_recipe=precision if fp8 else "delayed",
                                           fp8_min_gemm_dim=0), model.config)
    plan.prepare_model(model)
    opt = build_optimizer(model, OptimArgs(max_lr=1e-3, warmup_steps=0))
    step = lambda i: train_step(model, opt, [batches[i % 2]], plan=plan, max_grad_norm=1.0, lr=1e-3)  # noqa: E731
    dgamma = []  # layer 0's first norm weight's gradient at the first step: the norm backward's own output
    hook = model.model.layers[0].self_attention.layernorm_qkv.layer_norm_weight.register_hook(
        lambda g: dgamma.append(g.detach().float().cpu()) if not dgamma else None)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        losses = [step(0).loss.item()]
        torch.cuda.synchronize()
    hook.remove()
    kernels = sorted({e.key for e in prof.key_averages() if "norm" in e.key.lower()})
    losses += [step(i).loss.item() for i in range(1, 6)]
    return {"losses": losses, "norm_kernels": kernels, "dgamma": dgamma[0].tolist()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{kind: {precision: the child's record}}: one child process per kernel (TE and a model build once each)."""
    out = {}
    for kind in ("te", "cudnn"):
        path = tmp_path_factory.mktemp("norm") / f"{kind}.json"
        proc = subprocess.run([sys.executable, __file__, kind, str(path)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[kind] = json.loads(path.read_text())
    return out


@pytest.mark.parametrize("precision", PRECISIONS)
def test_cudnn_norm_kernels_replace_te_s_and_train_the_same(precision, runs):
    te_run, cudnn = runs["te"][precision], runs["cudnn"][precision]
    if "skipped" in te_run:
        pytest.skip(te_run["skipped"])
    te_kernels = lambda r: [k for k in r["norm_kernels"] if "transformer_engine::normalization" in k]  # noqa: E731
    assert te_kernels(te_run), te_run["norm_kernels"]  # the reference did run TE's kernels
    assert not te_kernels(cudnn), cudnn["norm_kernels"]  # the switch took: none of TE's, forward or backward
    # The same sums in another reduction order: BF16 rounding apart. A norm that skipped gamma or the 1/rms, or a
    # backward that dropped a term, moves the loss by O(1) and the norm weight's gradient by O(its norm).
    assert cudnn["losses"][0] == pytest.approx(te_run["losses"][0], rel=2e-3)
    a, b = torch.tensor(cudnn["dgamma"]), torch.tensor(te_run["dgamma"])
    assert ((a - b).norm() / b.norm()).item() < 2**-5
    assert cudnn["losses"] == pytest.approx(te_run["losses"], rel=0.02) and cudnn["losses"][-1] < cudnn["losses"][0]


def _child(kind: str) -> dict:
    out = {}
    for precision in PRECISIONS:
        ok, why = (True, None) if precision == "bf16" else _te.availability().get(precision, (False, "unknown"))
        out[precision] = _run(kind, precision) if ok else {"skipped": f"FP8 recipe {precision} unavailable: {why}"}
    return out


if __name__ == "__main__":  # the child: KIND OUT
    with open(sys.argv[2], "w") as f:
        json.dump(_child(sys.argv[1]), f)
