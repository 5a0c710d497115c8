"""Memory per GPU of a training step under each parallel strategy, from the real model's parameter
shapes on the meta device (nothing is allocated) and the activation formula of ``activations.py``.

Bytes per parameter (P parameters, N = the processes a strategy shards over):

- ``single`` / ``ddp`` (fp32 weights, BF16 autocast): weights 4, gradients 4, AdamW m and v 8;
  buffers: DDP's reducer buckets 4 (a copy of the gradients; none on one process).
- ``zero1`` (DeepSpeed bf16): weights 2, gradients 2, optimizer (4 + 8 + 4) / N (fp32 masters, m, v,
  the fp32 gradient partition).
- ``zero2``: weights 2, gradients 2 / N, optimizer 16 / N; buffers: DeepSpeed's reduce bucket.
- ``zero3``: weights 2 / N, gradients 2 / N, optimizer 16 / N; buffers: two gathered units in bf16
  (the one computing, the one prefetched) and one unit's gradients.
- ``fsdp2`` (``fully_shard``, bf16 compute, fp32 reduce): weights 4 / N (the fp32 shards are the
  masters), gradients 4 / N, optimizer 8 / N; buffers: two all-gathered units in bf16, one unit's
  bf16 gradients and their fp32 reduce copy.
- ``hsdp``: as ``fsdp2`` with N = the GPUs of a node (replicated across nodes).

A *unit* is what FSDP2 / ZeRO-3 gather at once: one decoder layer, or the root (embedding, final
norm, LM head), whichever is larger. Strategies with fp32 weights under autocast (``single``,
``ddp``) also hold autocast's bf16 copy of every matmul weight from forward to backward (2 bytes per
matmul parameter), and in backward the largest weight's bf16 gradient and its fp32 copy before it is
added to ``.grad`` (6 bytes per parameter of that weight). On the TE backend those copies are TE's own:
each fp32 weight's BF16 cast, or in FP8 its FP8 copy and transpose, the same 2 bytes. With
``master_weights: fp32`` (one process) the weights are BF16 (2), their fp32 masters join the optimizer
(4 + 8), the gradients are the masters' fp32 ones (4), and only FP8 keeps weight copies (2 per matmul
parameter: the H200 peaks of 2026-11-26 hold 2 bytes per parameter more with masters in FP8, none in BF16).
Gradients are counted in full: with gradient accumulation they live through the next micro-batch's
forward and backward (the peak); with one micro-batch per step they are made in backward, after the loss's
peak (the measured checks take them out there).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .activations import activations

STRATEGIES = ("single", "ddp", "zero1", "zero2", "hsdp", "fsdp2", "zero3")  # least to most communication
DS_BUCKET = 500_000_000  # elements: DeepSpeed's reduce_bucket_size default (and ds_configs/zero2.json's)


@dataclass(frozen=True)
class Shapes:
    """Parameter counts of the real model, read on the meta device."""

    params: int       # distinct parameters (a tied weight once)
    matmul: int       # parameters that take part in a matmul (the N of 6N)
    layer: int        # one decoder layer
    root: int         # everything outside the layers (embedding, final norm, untied LM head)
    largest: int      # the largest weight

    @property
    def unit(self) -> int:
        return max(self.layer, self.root)


def model_shapes(config) -> Shapes:
    """Build ``YxanulForCausalLM(config)`` on the meta device and count its parameters."""
    import torch

    from ..models.configuration_yxanul import matmul_parameters  # torch: `yxanul plan --help` stays light
    from ..models.modeling_yxanul import YxanulForCausalLM  # torch: `yxanul plan --help` stays light

    with torch.device("meta"):
        model = YxanulForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    layer = max(sum(p.numel() for p in blk.parameters()) for blk in model.model.layers)
    largest = max(p.numel() for p in model.parameters())
    return Shapes(total, matmul_parameters(config), layer, total - layer * len(model.model.layers), largest)


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU, by component; ``total`` is their sum."""

    strategy: str
    shard: int          # processes the model state is sharded over (1: replicated)
    weights: int
    gradients: int
    optimizer: int
    buffers: int
    weight_casts: int
    activations: int

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.buffers + self.weight_casts
                + self.activations)

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def shard_size(strategy: str, world: int, gpus_per_node: int) -> int:
    if strategy in ("single", "ddp"):
        return 1
    return gpus_per_node if strategy == "hsdp" else world


def state_bytes(strategy: str, s: Shapes, n: int, world: int, head: int = 0, *, masters: bool = False,
                fp8: bool = False) -> tuple[int, int, int, int, int]:
    """(weights, gradients, optimizer, buffers, weight_casts) per GPU (module docstring's table); ``head``: LM-head
    parameters whose BF16 copy is not kept (the chunked loss casts its own, transiently); ``masters``: one
    process with BF16 weights and fp32 masters (``master_weights: fp32``), ``fp8`` their FP8 copies."""
    P = s.params
    if strategy == "single" and masters:
        return 2 * P, 4 * P, 12 * P, 0, (2 * (s.matmul - head) if fp8 else 0) + 6 * s.largest
    if strategy in ("single", "ddp"):
        return 4 * P, 4 * P, 8 * P, (4 * P if world > 1 else 0), 2 * (s.matmul - head) + 6 * s.largest
    if strategy == "zero1":
        return 2 * P, 2 * P, 16 * P // n, 0, 0
    if strategy == "zero2":
        return 2 * P, 2 * P // n, 16 * P // n, 2 * min(DS_BUCKET, P), 0
    if strategy == "zero3":
        return 2 * P // n, 2 * P // n, 16 * P // n, (2 * 2 + 2) * s.unit, 0
    if strategy in ("fsdp2", "hsdp"):
        return 4 * P // n, 4 * P // n, 8 * P // n, (2 * 2 + 2 + 4) * s.unit, 0
    raise ValueError(f"unknown strategy {strategy!r}")


def memory(strategy: str, config, shapes: Shapes, *, micro: int, seq_length: int, checkpointing: bool,
           world: int, gpus_per_node: int, backend: str = "torch", fp8: bool = False,
           loss_impl: str = "default", masters: bool = False) -> Memory:
    """The memory of one GPU training ``config`` with ``strategy`` (``backend``/``fp8``/``loss_impl``: the
    activations' terms, ``activations.py``; ``masters``: `state_bytes`)."""
    n = shard_size(strategy, world, gpus_per_node)
    a = activations(config, micro, seq_length, checkpointing, backend=backend, fp8=fp8, loss_impl=loss_impl)
    act = a.saved + max(a.loss_peak, a.recompute)
    head = config.vocab_size * config.hidden_size if loss_impl == "chunked" else 0
    return Memory(strategy, n, *state_bytes(strategy, shapes, n, world, head, masters=masters, fp8=fp8), act)
