"""The planner against measured peak memory of real training steps: the CPU's peak resident set (fast,
here) and torch.cuda.max_memory_allocated (marker gpu). Within 15 % (issue 31's bar)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from yxanul.models import YxanulConfig, config_from_preset
from yxanul.planning.memory import memory, model_shapes

TOLERANCE = 0.15
# state-dominated (a 32k vocabulary, 9.4M parameters, 32 tokens) and activation-dominated (0.9M
# parameters, 1024 tokens), with and without checkpointing: ~250 MB at most, seconds of CPU. The CPU
# resident set also holds ~5-7 MB of the CPU kernels' own scratch whatever the tokens (measured at micro
# 1, 2, 4, 8 x 256: 6.6, 4.8-9.5, 5.7-7.9, 5.8 MB above the plan), which the per-token model does not hold:
# at micro 2 that alone was 9-15 % of the case (a -15.4 % failure under load); at micro 4 it is ~8 %.
STATE = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=704, vocab_size=32768)
ACTIV = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=384, vocab_size=4096)
CPU_CASES = [dict(fields=STATE, micro=1, seq_length=32), dict(fields=ACTIV, micro=4, seq_length=256),
             dict(fields=ACTIV, micro=4, seq_length=256, checkpointing=True)]


def planned(case, strategy="single", world=1) -> int:
    c = YxanulConfig(**case["fields"], max_position_embeddings=case["seq_length"], backend="torch")
    return memory(strategy, c, model_shapes(c), micro=case["micro"], seq_length=case["seq_length"],
                  checkpointing=case.get("checkpointing", False), world=world, gpus_per_node=world,
                  backend=case.get("backend", "torch"), fp8=case.get("fp8", False),
                  loss_impl=case.get("loss_impl", "default")).total


def run_measure(cases, device, tmp_path, ranks=1, strategy="single") -> list[dict]:
    f = tmp_path / "cases.json"
    f.write_text(json.dumps(cases))
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # freed tensors leave the resident set
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc_per_node", str(ranks)]
    out = subprocess.run([*launch, "-m", "yxanul.planning.measure", str(f), device, strategy], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return _objects(out.stdout)


def _objects(text: str) -> list[dict]:
    """The JSON rows in ``text``: two ranks print to one pipe, so two rows may share a line."""
    rows, dec, i = [], json.JSONDecoder(), 0
    while (i := text.find("{", i)) >= 0:
        row, i = dec.raw_decode(text, i)
        rows.append(row)
    return rows


def check(cases, got, strategy="single", world=1):
    for case, g in zip(cases, got, strict=True):
        plan, peak = planned(case, strategy, world), g["peak_bytes"]
        assert abs(plan - peak) <= TOLERANCE * peak, (case, plan, peak, (plan - peak) / peak)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux: peak RSS reset")
def test_plan_within_15_percent_of_the_cpu_peak_rss(tmp_path):
    check(CPU_CASES, run_measure(CPU_CASES, "cpu", tmp_path))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux: peak RSS reset")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_rank_plan_within_15_percent_of_each_ranks_peak_rss(tmp_path, strategy):
    """Two gloo ranks under torchrun. ddp: DistributedDataParallel with its defaults, whose reducer
    buckets copy the gradients (4 bytes per parameter); fsdp2: fully_shard per layer and at the root,
    bf16 compute, fp32 reduce: fp32 shards, and the gathered units of the root (the 32k embedding)."""
    cases = CPU_CASES[:1]
    got = run_measure(cases, "cpu", tmp_path, ranks=2, strategy=strategy)
    assert [g["world_size"] for g in got] == [2, 2]
    check(cases * 2, got, strategy, world=2)


GPU_CASES = [  # MHA (flash attention) and GQA, with and without checkpointing
    dict(fields="small", micro=8, seq_length=1024),
    dict(fields="small", micro=8, seq_length=1024, checkpointing=True),
    dict(fields="yxanul-0.6b", micro=4, seq_length=2048),
]


TE_GPU_CASES = [  # the TE backend where the committed bench peaks do not reach: GQA, checkpointing, TE's loss
    dict(fields="yxanul-0.6b", micro=4, seq_length=2048, backend="te"),
    dict(fields="yxanul-0.6b", micro=4, seq_length=2048, backend="te", fp8=True, loss_impl="te"),
    dict(fields="small", micro=8, seq_length=1024, backend="te", checkpointing=True),
    dict(fields="small", micro=8, seq_length=1024, backend="te", fp8=True, loss_impl="chunked"),
]


def _gpu_cases(cases):
    out = []
    for case in cases:
        c = config_from_preset(case["fields"], 50257, case["seq_length"])
        keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size")
        out.append({**case, "fields": {k: getattr(c, k) for k in keys}})
    return out


@pytest.mark.gpu
def test_plan_within_15_percent_of_cuda_max_memory_allocated(tmp_path):
    assert torch.cuda.is_available()
    cases = _gpu_cases(GPU_CASES)
    check(cases, run_measure(cases, "cuda", tmp_path))


@pytest.mark.gpu
@pytest.mark.te
def test_te_plan_within_15_percent_of_cuda_max_memory_allocated(tmp_path):
    """The TE plan on shapes the committed peaks lack (GQA, checkpointing, TE's loss, the chunked loss in FP8),
    two accumulated micro-batches x two steps: the gradients live at the peak, as the plan counts them."""
    from yxanul import _te

    if not (torch.cuda.is_available() and _te.TE_AVAILABLE and _te.availability()["delayed"][0]):
        pytest.skip("needs a CUDA GPU with Transformer Engine's FP8 (delayed scaling)")
    cases = _gpu_cases(TE_GPU_CASES)
    check(cases, run_measure(cases, "cuda", tmp_path))


def _te_rows():
    """The committed H200 bench rows a plan can be checked against: TE backend, eager (a CUDA-graphed row's peak
    reads 30-35 % below the eager row's: the graphs' private pool; ``torch_compile`` and the fused wgrad's
    persistent gradients are other layouts), each row's loss and master weights from its variant."""
    from pathlib import Path

    rows = []
    for f in sorted((Path(__file__).resolve().parents[2] / "docs" / "bench").glob("*-h*.json")):
        data = json.loads(f.read_text())
        accumulation = (data.get("args") or {}).get("gradient_accumulation_steps") or 1
        for r in data.get("rows", ()):
            parts = (r.get("variant") or "").split("+")
            if r.get("status") != "ok" or r.get("backend") != "te" or {"graphs", "compile", "wgrad"} & set(parts):
                continue
            loss = next((p.split("=")[1] for p in parts if p.startswith("loss=")), "default")
            rows.append((f.name, r, loss, "master=fp32" in parts, accumulation))
    return rows


def test_te_plan_within_15_percent_of_the_committed_h200_peaks():
    """``torch.cuda.max_memory_allocated`` of `yxanul bench`'s timed steps on the H200 (docs/bench/*.json: model,
    optimizer states, activations; micro-batch 16 x 1024 tokens at gpt2-124m, medium, xlarge; BF16 and FP8;
    the three losses; with and without fp32 master weights). With one micro-batch per step the gradients are
    made in backward after the loss's peak (zero_grad sets them to None): the plan without them there. The
    issue's bar is 15 %; rows of only the flags the plan models are held to 5 % (they are within 1.6 %): an FP8
    row without the SwiGLU output's byte saved is 3-5 % off."""
    modelled = {"", "fused_qkv", "qkv_rope", "master=fp32", "loss=te", "loss=chunked"}
    rows = _te_rows()
    assert len({(r["preset"], r["precision"], loss, masters, acc) for _, r, loss, masters, acc in rows}) >= 20
    for name, r, loss, masters, accumulation in rows:
        c = config_from_preset(r["preset"], 50257, r["seq_length"])
        m = memory("single", c, model_shapes(c), micro=r["micro_batch"], seq_length=r["seq_length"],
                   checkpointing=False, world=1, gpus_per_node=1, backend="te", fp8=r["precision"] != "bf16",
                   loss_impl=loss, masters=masters)
        plan, peak = m.total - (m.gradients if accumulation == 1 else 0), r["peak_memory_gib"] * 2**30
        bar = 0.05 if set((r.get("variant") or "").split("+")) <= modelled else TOLERANCE
        assert abs(plan - peak) <= bar * peak, (name, r["preset"], r["precision"], loss, plan, peak)
