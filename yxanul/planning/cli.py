"""`yxanul plan`: memory per GPU of a preset under DDP, ZeRO-1/2/3, FSDP2 and HSDP, which strategies
fit, which to run, and the `accelerate launch` line. No GPU and no weights: the parameter shapes come
from the real model on the meta device, the activations from the formula of activations.py
(checked against what autograd saves, and against measured peaks: docs/distributed.md).

The choice: the first strategy that fits in ``STRATEGIES`` order (least communication first: DDP
all-reduces gradients once per step; ZeRO-1/2 add a parameter all-gather after the step; HSDP and
FSDP2 / ZeRO-3 all-gather every layer's weights in forward and again in backward, HSDP only inside a
node), without activation checkpointing before with it (recomputing the forward adds ~33 % compute,
more than the next sharding step costs when its communication overlaps).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Literal

from ..config_file import load_yaml
from ..data.tokenizer_load import run_vocab_size
from ..errors import ConfigError
from ..flags import check_same_as, coerce, fields_of, given_flags, parse_command, same_as
from ..models.args import ModelArgs
from ..models.presets import PRESETS
from ..precision.args import PrecisionArgs
from ..training.batching.args import BatchArgs
from .memory import STRATEGIES, Memory, memory, model_shapes

GiB = 2**30
CUDA_CONTEXT = 1 * GiB  # CUDA context, cuBLAS / NCCL workspaces: outside the caching allocator
MAX_MICRO = 4096

# strategy -> accelerate profile (accelerate_configs/)
PROFILES = {"single": "single_gpu_fp8.yaml", "ddp": "multi_gpu_fp8.yaml", "zero1": "deepspeed_zero1_fp8.yaml",
            "zero2": "deepspeed_zero2_fp8.yaml", "zero3": "deepspeed_zero3_fp8.yaml", "fsdp2": "fsdp2.yaml",
            "hsdp": "fsdp2_hsdp.yaml"}
MULTI_NODE_DDP = "multi_node_fp8.yaml"
PLACEHOLDER_CONFIG = "CONFIG.yaml"  # the launch line's --config without --config: the user's to fill in


@dataclass
class PlanCommand:
    """Plan the memory per GPU of a training run and the strategy to launch it with."""

    preset: str = field(default="7b", metadata={"help": "Model preset: " + ", ".join(PRESETS) + ".",
                                                "aliases": ["--model"]})
    seq_length: int = same_as(ModelArgs, "seq_length", default=2048)
    micro_batch_size: int = same_as(BatchArgs, "micro_batch_size", default=1)
    gpu_memory: float = field(default=80.0, metadata={"help": "Memory of one GPU in GiB (an H100 80GB has 79.2)."})
    gpus: int = field(default=8, metadata={"help": "GPUs per node."})
    nodes: int = field(default=1, metadata={"help": "Nodes."})
    headroom: float = field(default=0.1, metadata={
        "help": "Fraction of the GPU memory kept free for fragmentation and temporaries (1 GiB for the CUDA "
                "context comes off as well)."})
    vocab_size: int | None = field(default=None, metadata={
        "help": "Tokenizer size (padded as the trainer pads it). Default: what train would use: the tokenizer of "
                "--config (a data_dir given alone: its prepared size), else the bundled 8k BPE."})
    backend: Literal["te", "torch"] = field(default="te", metadata={
        "help": "Layer implementation of the run: te (Transformer Engine, what GPU runs use) or torch (the plain "
                "twin); their activations differ (docs/distributed.md)."})
    use_fp8: bool = same_as(PrecisionArgs, "use_fp8")
    loss_impl: Literal["default", "chunked", "te"] | None = same_as(ModelArgs, "loss_impl", default=None)
    master_weights: Literal["none", "fp32"] = same_as(PrecisionArgs, "master_weights")
    config: str | None = field(default=None, metadata={
        "once": True,
        "help": "Training config named in the launch line, read as `yxanul train --config` reads it (a missing or "
                "broken file is one line, exit 2); without it the line says CONFIG.yaml, to fill in."})
    json: bool = field(default=False, metadata={"help": "Print the plan as JSON."})

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ConfigError("preset", "one of " + ", ".join(PRESETS), self.preset)
        check_same_as(self)
        for key in ("gpus", "nodes", "vocab_size"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(key, "an integer >= 1", getattr(self, key))
        if not 0 < self.gpu_memory < math.inf:
            raise ConfigError("gpu_memory", "a number of GiB > 0", self.gpu_memory)
        if not 0 <= self.headroom < 1:
            raise ConfigError("headroom", "a fraction in [0, 1)", self.headroom)
        if self.backend == "torch" and self.use_fp8:
            raise ConfigError("use_fp8", "false with backend torch (FP8 runs on Transformer Engine)", True)
        if self.backend == "torch" and self.loss_impl == "te":
            raise ConfigError("loss_impl", "default or chunked with backend torch (te is Transformer Engine's)", "te")
        run = {} if self.config is None else load_yaml(self.config)  # train reads it first: a bad one fails here
        if self.vocab_size is None:
            self.vocab_size = run_vocab_size(run)
        if self.master_weights == "fp32" and self.world > 1:
            raise ConfigError("master_weights", "none with more than one GPU (DDP, DeepSpeed and FSDP2 keep their "
                                                "own masters)", "fp32")

    @property
    def world(self) -> int:
        return self.gpus * self.nodes

    @property
    def budget(self) -> int:
        """Bytes a training step may use on one GPU."""
        return int(self.gpu_memory * GiB * (1 - self.headroom)) - CUDA_CONTEXT


def loss_of(a: PlanCommand) -> str:
    """The run's loss: the flag, else the speed-defaults table's for (backend, preset) (every launch takes that
    key), else ``default``."""
    if a.loss_impl is not None:
        return a.loss_impl
    from ..training.speed_defaults import load_table  # yaml: --help stays light

    return load_table().get(a.backend, {}).get(a.preset, {}).get("values", {}).get("loss_impl", "default")


def candidates(a: PlanCommand) -> list[str]:
    return _strategies(a.world, a.nodes)


def _strategies(world: int, nodes: int) -> list[str]:
    if world == 1:
        return ["single"]
    return [s for s in STRATEGIES if s != "single" and (s != "hsdp" or nodes > 1)]


def comm_bytes(strategy: str, params: int, world: int, gpus_per_node: int) -> int:
    """Bytes one GPU sends per optimizer step (ring collectives, no accumulation): DDP all-reduces fp32
    gradients (2 x 4P); ZeRO-1/2 reduce-scatter bf16 gradients and all-gather bf16 weights (2P + 2P);
    ZeRO-3 all-gathers bf16 weights twice and reduce-scatters bf16 gradients (6P); FSDP2 all-gathers
    bf16 weights twice and reduce-scatters fp32 gradients (2P + 2P + 4P); HSDP does FSDP2's inside a
    node and all-reduces its fp32 gradient shard across nodes (2 x 4P / GPUs per node)."""
    ring = (world - 1) / world
    per_param = {"single": 0, "ddp": 8 * ring, "zero1": 4 * ring, "zero2": 4 * ring, "zero3": 6 * ring,
                 "fsdp2": 8 * ring}
    if strategy == "hsdp":
        n, nodes = gpus_per_node, world // gpus_per_node
        return int(params * (8 * (n - 1) / n + 8 / n * (nodes - 1) / nodes))
    return int(params * per_param[strategy])


def max_micro(fit, budget: int) -> int:
    """The largest micro-batch m <= MAX_MICRO with fit(m).total <= budget (0 if not even 1)."""
    lo, hi = 0, MAX_MICRO
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fit(mid).total <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan(a: PlanCommand) -> dict:
    """The whole plan as plain data (what --json prints)."""
    from ..models.configuration_yxanul import config_from_preset  # transformers: --help stays light

    config = config_from_preset(a.preset, a.vocab_size, a.seq_length, backend="torch")  # shapes: either backend
    shapes = model_shapes(config)
    loss = loss_of(a)
    rows, choice = [], None
    for ckpt in (False, True):
        for s in candidates(a):
            def at(m, s=s, ckpt=ckpt) -> Memory:
                return memory(s, config, shapes, micro=m, seq_length=a.seq_length, checkpointing=ckpt,
                              world=a.world, gpus_per_node=a.gpus, backend=a.backend, fp8=a.use_fp8,
                              loss_impl=loss, masters=a.master_weights == "fp32")
            m = at(a.micro_batch_size)
            row = {**m.as_dict(), "checkpointing": ckpt, "fits": m.total <= a.budget,
                   "max_micro_batch": max_micro(at, a.budget),
                   "comm_bytes": comm_bytes(s, shapes.params, a.world, a.gpus)}
            rows.append(row)
            if choice is None and row["fits"]:
                choice = row
    return {"preset": a.preset, "params": shapes.params, "vocab_size": a.vocab_size,
            "flops_per_token": config.flops_per_token(a.seq_length),
            "seq_length": a.seq_length, "micro_batch_size": a.micro_batch_size, "gpus_per_node": a.gpus,
            "backend": a.backend, "fp8": a.use_fp8, "loss_impl": loss, "master_weights": a.master_weights,
            "nodes": a.nodes, "gpu_memory_gib": a.gpu_memory, "budget_bytes": a.budget, "rows": rows,
            "advice": [] if choice else advice(a, config, shapes, loss, rows),
            "choice": choice and {"strategy": choice["strategy"], "checkpointing": choice["checkpointing"],
                                  "max_micro_batch": choice["max_micro_batch"],
                                  "launch": launch_line(a, choice["strategy"], choice["checkpointing"])}}


def advice(a: PlanCommand, config, shapes, loss: str, rows: list[dict]) -> list[str]:
    """When nothing fits: the flags that would make something fit, each change alone (the other flags as given),
    each checked with the same memory model. Activation checkpointing and every strategy are rows of the table
    already: never advised; a smaller micro-batch only where one fits."""
    masters = a.master_weights == "fp32"

    def fits(micro=a.micro_batch_size, seq=a.seq_length, gpus=a.gpus, nodes=a.nodes, masters=masters) -> bool:
        return any(memory(s, config, shapes, micro=micro, seq_length=seq, checkpointing=ckpt, world=gpus * nodes,
                          gpus_per_node=gpus, backend=a.backend, fp8=a.use_fp8, loss_impl=loss,
                          masters=masters).total <= a.budget
                   for ckpt in (False, True) for s in _strategies(gpus * nodes, nodes))

    out = []
    if micro := max(r["max_micro_batch"] for r in rows):  # rows' max_micro_batch: 0 when not even 1 fits
        out.append(f"--micro_batch_size {micro}")
    if seq := next((s for s in _halvings(a.seq_length) if fits(seq=s)), None):
        out.append(f"--seq_length {seq}")
    if masters and fits(masters=False):
        out.append("--master_weights none")
    if layout := next(((g, n) for g, n in _more_gpus(a) if fits(gpus=g, nodes=n, masters=False)), None):
        g, n = layout  # more than one GPU keeps its masters in the strategy: master_weights none there
        out.append(f"--gpus {g}" + f" --nodes {n}" * (n > 1) + " --master_weights none" * masters)
    need = (min(r["total"] for r in rows) + CUDA_CONTEXT) / (1 - a.headroom) / GiB
    out.append(f"--gpu_memory {math.ceil(need * 10) / 10:g}")
    return out


def _halvings(seq_length: int, shortest: int = 128) -> list[int]:
    return [seq_length >> k for k in range(1, seq_length.bit_length()) if seq_length >> k >= shortest]


def _more_gpus(a: PlanCommand) -> list[tuple[int, int]]:
    """(GPUs per node, nodes) larger than ``a``'s, fewest GPUs first: up to 8 in the one node, then up to 128
    nodes of that many."""
    one_node = [(g, 1) for g in (2, 4, 8) if a.nodes == 1 and g > a.gpus]
    per_node = max(a.gpus, 8) if a.nodes == 1 else a.gpus
    return one_node + [(per_node, n) for n in (2, 4, 8, 16, 32, 64, 128) if n > a.nodes]


def launch_line(a: PlanCommand, strategy: str, checkpointing: bool) -> str:
    """The exact `accelerate launch` command (run on every node with its own NODE_RANK)."""
    profile = MULTI_NODE_DDP if strategy == "ddp" and a.nodes > 1 else PROFILES[strategy]
    parts = ["accelerate launch", f"--config_file accelerate_configs/{profile}"]
    if not a.use_fp8 and not strategy.startswith("zero"):  # the profile says fp8: accelerate refuses it without TE
        parts.append("--mixed_precision bf16")             # (the DeepSpeed ones leave precision to the config)
    if strategy != "single":
        parts += [f"--num_machines {a.nodes}", f"--num_processes {a.world}"]
    if a.nodes > 1:
        parts += ["--machine_rank $NODE_RANK", "--main_process_ip $MAIN_IP", "--main_process_port 29500"]
    if strategy == "hsdp":  # replicate over the nodes, shard over the GPUs of each (the profile says 2 x 8)
        parts += [f"--parallelism_config_dp_replicate_size {a.nodes}", f"--parallelism_config_dp_shard_size {a.gpus}"]
    parts += ["train.py", f"--config {a.config or PLACEHOLDER_CONFIG}", f"--model {a.preset}",
              f"--seq_length {a.seq_length}", f"--micro_batch_size {a.micro_batch_size}"]
    if checkpointing:
        parts.append("--gradient_checkpointing true")
    if a.backend == "torch":
        parts.append("--backend torch")
    parts += ["--use_fp8 true"] * a.use_fp8 + [f"--loss_impl {a.loss_impl}"] * (a.loss_impl is not None)
    parts += ["--master_weights fp32"] * (a.master_weights == "fp32")
    return " ".join(parts)


def _gib(b: int) -> str:
    return f"{b / GiB:.1f}"


def table(p: dict) -> str:
    """The readable form of ``plan()``."""
    params = f"{p['params'] / 1e9:.2f}B" if p["params"] >= 1e9 else f"{p['params'] / 1e6:.2f}M"
    head = (f"{p['preset']}: {params} parameters (vocabulary {p['vocab_size']}), "
            f"{p['flops_per_token'] / 1e9:.3g} GFLOPs/token at "
            f"seq {p['seq_length']}, micro-batch {p['micro_batch_size']}, {p['nodes']} node(s) x {p['gpus_per_node']} "
            f"GPUs of {p['gpu_memory_gib']:g} GiB (budget {_gib(p['budget_bytes'])} GiB per GPU); backend "
            f"{p['backend']}, {'FP8' if p['fp8'] else 'BF16'}, loss {p['loss_impl']}"
            + (", fp32 master weights" if p["master_weights"] == "fp32" else ""))
    cols = ("strategy", "ckpt", "shard", "weights", "grads", "optim", "buffers", "casts", "activ", "total", "fits",
            "max micro", "comm GB/step")
    lines = [head, "GiB per GPU:", "  ".join(f"{c:>8}" for c in cols)]
    for r in p["rows"]:
        cells = (r["strategy"], "yes" if r["checkpointing"] else "no", r["shard"], *map(_gib, (
                 r["weights"], r["gradients"], r["optimizer"], r["buffers"], r["weight_casts"], r["activations"],
                 r["total"])),
                 "yes" if r["fits"] else "NO",
                 r["max_micro_batch"], f"{r['comm_bytes'] / 1e9:.1f}")
        lines.append("  ".join(f"{c:>8}" for c in cells))
    c = p["choice"]
    if c is None:
        lines.append("nothing fits (any strategy, with or without activation checkpointing); each of these alone "
                     "would: " + " | ".join(p["advice"]))
    else:
        lines.append(f"fastest that fits: {c['strategy']}" + (" with activation checkpointing" if c["checkpointing"]
                                                               else "")
                     + f" (micro-batches up to {c['max_micro_batch']} fit)")
        lines.append(c["launch"])
    return "\n".join(lines)


# the plan's fields a training config sets, by the config's key (the run's model is the plan's preset)
FROM_CONFIG = {"model": "preset", "seq_length": "seq_length", "micro_batch_size": "micro_batch_size",
               "backend": "backend", "use_fp8": "use_fp8", "loss_impl": "loss_impl", "master_weights": "master_weights"}


def with_config(a: PlanCommand, given: set[str]) -> PlanCommand:
    """The run ``--config`` describes: its model, seq_length, micro-batch, backend, FP8, loss and master weights
    where the command line left them unset (a flag wins, as in `yxanul train --config F --flag`). The config's
    ``backend: auto`` is the GPU run's ``te``; its key, not the plan's default, is what the plan is of."""
    if a.config is None:
        return a
    run, fields = load_yaml(a.config), fields_of(PlanCommand)
    aliases = {"preset": {"preset", "model"}}
    values = {}
    for key, name in FROM_CONFIG.items():
        if key in run and not aliases.get(name, {name}) & given and not (key == "backend" and run[key] == "auto"):
            values[name] = coerce(key, fields[name][1], run[key], from_cli=False)
    return dataclasses.replace(a, **values) if values else a


def main(argv: list[str] | None = None) -> int:
    """`yxanul plan --preset 7b --seq_length 4096 --gpus 8 --nodes 2 --gpu_memory 80 [--json]`."""
    a = parse_command(PlanCommand, argv, prog="yxanul plan", description=__doc__.split("\n\n")[0])
    a = with_config(a, given_flags(argv))
    p = plan(a)
    print(json.dumps(p, indent=2) if a.json else table(p))
    return 0 if p["choice"] else 1
