"""CUDA graphs of the TE decoder blocks (``cuda_graphs: true``): they cut the host overhead of launching each kernel.

Each `TEDecoderLayer` is captured with Transformer Engine's ``make_graphed_callables`` (through
`yxanul._te`, with the plan's FP8 recipe and FP8 weight caching when FP8 is on), so a training
forward/backward replays one graph per block instead of launching its kernels from Python. The
embedding, the final norm, the LM head + loss and the optimizer stay outside the graphs.

Capture happens once, lazily, in `train_step` before the first micro-batch of the first step, outside
any autocast context (TE refuses autocast caching during capture; the capture itself runs under
``torch.autocast(cache_enabled=False)`` when the plan is BF16, as the training forward does). From then on
the shapes are static: a training step with another (micro-batch, seq_length) -- a curriculum stage,
the batch finder's probes, a short batch -- is a one-line ConfigError naming ``cuda_graphs``.
Evaluation (``model.eval()``) runs the blocks eagerly (TE's graphed forward falls back when the
training flag differs from the captured one).

Not with: the torch backend or a CPU (ConfigError from `build_model`, i.e. before training starts, and
at the first step), gradient checkpointing (ConfigError at capture).
"""

from __future__ import annotations

import torch

from .. import _te
from ..errors import ConfigError
from ..precision import master_weights

ATTR = "_yx_graphed_shape"  # on the inner model: the (B, T) the blocks were captured at


def check_config(config) -> None:
    """Graphs need TE blocks on a CUDA device (`build_model` and the first step check; a saved config
    with ``cuda_graphs`` still loads anywhere with from_pretrained, e.g. on its torch twin)."""
    if getattr(config, "cuda_graphs", False) and (config.backend != "te" or not torch.cuda.is_available()):
        raise ConfigError("cuda_graphs", "false here (CUDA graphs capture Transformer Engine blocks: backend te "
                                         f"on a CUDA GPU; backend is '{config.backend}')", True)


def _inner(model):
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        nxt = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(nxt, torch.nn.Module):
            break
        model = nxt
    return model


def ensure_captured(model, input_ids: torch.Tensor, plan) -> bool:
    """Capture the blocks of ``model`` at ``input_ids``' (B, T) on the first call; afterwards check the
    shape. Returns True when the blocks run as graphs. A no-op (False) without ``cuda_graphs``."""
    inner = _inner(model)
    config = getattr(inner, "config", None)
    if not getattr(config, "cuda_graphs", False) or not inner.training:
        return False
    check_config(config)
    shape = tuple(input_ids.shape)
    captured = getattr(inner, ATTR, None)
    if captured is not None:
        if captured != shape:
            raise ConfigError("cuda_graphs", f"false with a changing micro-batch or seq_length (the blocks were "
                                             f"captured at (B, T) = {captured}, this step has {shape}: a curriculum, "
                                             "the batch finder or a short batch; fix micro_batch_size)", True)
        return True
    base = inner.model if hasattr(inner, "model") else inner
    if base.gradient_checkpointing:
        raise ConfigError("cuda_graphs", "false with gradient_checkpointing (TE's checkpoint recomputes "
                                         "outside the captured graph)", True)
    with master_weights.paused():  # the warm-up's backward passes on sample data must not reach fp32 masters
        _capture(base, shape, plan)
    for p in inner.parameters():  # nor any of its sample gradients the first step
        p.grad = None
    master_weights.clear_grads(inner)
    object.__setattr__(inner, ATTR, shape)
    return True


def _capture(base, shape: tuple[int, int], plan) -> None:
    """``te.make_graphed_callables`` over every block, with samples shaped as the training forward's."""
    B, T = shape
    C = base.config.hidden_size
    bf16 = plan is not None and plan.base == "bf16"
    device = base.embed_tokens.weight.device
    first = base.embed_tokens.weight.dtype  # the embedding's output dtype
    rest = torch.bfloat16 if bf16 else first  # a TE block's output dtype under autocast
    freqs = base.rotary_emb(T, 0)  # [T, 1, 1, hd], not trainable
    samples = tuple((torch.randn(B, T, C, device=device, dtype=first if i == 0 else rest, requires_grad=True), freqs)
                    for i in range(len(base.layers)))
    fp8 = bool(plan is not None and plan.fp8_enabled)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
        _te.make_graphed_callables(tuple(base.layers), samples, enabled=fp8,
                                   recipe=plan.recipe if fp8 else None, cache_weights=fp8)
