"""Micro-batch search with injected OOM probes, accumulation math, cache, the real CPU probe, CLI."""

import math

import pytest
import torch

import yxanul.tools.find_batch as fb
import yxanul.training.batching.finder as bf
from yxanul.errors import ConfigError
from yxanul.training.batching import (
    BatchArgs,
    NoFitError,
    TrainingProbe,
    cache_fields,
    find_micro_batch,
    fp8_micro_multiple,
    get_or_find,
    micro_multiple,
    plan_batch,
    plan_curriculum,
    resolve_batch,
)


@pytest.fixture(autouse=True)
def _user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "user_cache"))


def oom_above(limit, calls=None, exc=None):
    def probe(b):
        if calls is not None:
            calls.append(b)
        if b > limit:
            raise (exc or torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    return probe


def bound(max_size, multiple=1):
    return 2 * math.ceil(math.log2(max_size // multiple)) + 1


def test_search_finds_every_boundary_with_few_probes():
    for max_size in (1, 7, 64, 256, 1000):
        for limit in range(1, max_size + 3):
            res = find_micro_batch(oom_above(limit), max_size=max_size, safety_margin=1.0, free=None)
            assert res.largest_ok == min(limit, max_size) == res.micro_batch, (max_size, limit)
            assert res.smallest_fail == (limit + 1 if limit < max_size else None)
            assert len(res.probes) <= max(1, bound(max_size)), (max_size, limit, res.probes)


@pytest.mark.parametrize("multiple", [2, 3, 8, 16])
def test_search_respects_multiples(multiple):
    for limit in range(multiple, 300):
        res = find_micro_batch(oom_above(limit), max_size=256, multiple=multiple, safety_margin=1.0, free=None)
        assert res.largest_ok == min(limit, 256) // multiple * multiple
        assert all(b % multiple == 0 and b <= 256 for b, _, _ in res.probes)
        assert len(res.probes) <= bound(256, multiple)
    res = find_micro_batch(oom_above(100), max_size=256, multiple=8, safety_margin=0.9, free=None)
    assert (res.largest_ok, res.micro_batch) == (96, 80)  # int(96 * 0.9) = 86 -> down to a multiple of 8


def test_oom_kinds_margin_and_start():
    for exc in (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"),
                RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
                torch.cuda.OutOfMemoryError("CUDA out of memory.")):
        assert find_micro_batch(oom_above(37, exc=exc), max_size=256, safety_margin=1.0, free=None).largest_ok == 37
    res = find_micro_batch(oom_above(100), max_size=256, free=None)  # default margin 0.9, applied after an OOM
    assert (res.largest_ok, res.micro_batch, res.smallest_fail) == (100, 90, 101)
    res = find_micro_batch(oom_above(10_000), max_size=64, free=None)  # cap reached: no margin
    assert (res.micro_batch, res.smallest_fail) == (64, None)
    res = find_micro_batch(oom_above(5), max_size=256, start=64, safety_margin=1.0, free=None)  # start too big
    assert res.largest_ok == 5
    seen = []
    res = find_micro_batch(oom_above(20), max_size=64, on_probe=lambda *p: seen.append(p))  # default free()
    assert seen == res.probes and [b for b, _, _ in seen][:5] == [1, 2, 4, 8, 16]


def test_non_oom_errors_propagate_and_nothing_fits():
    def broken(b):
        raise ValueError("shape mismatch")
    with pytest.raises(ValueError, match="shape mismatch"):
        find_micro_batch(broken, max_size=8, free=None)
    with pytest.raises(RuntimeError, match="device-side assert"):
        find_micro_batch(oom_above(0, exc=RuntimeError("CUDA error: device-side assert triggered")), max_size=8)
    with pytest.raises(NoFitError, match="even a micro-batch of 1"):
        find_micro_batch(oom_above(0), max_size=8, free=None)


def test_ranks_agree_on_the_minimum():
    # this rank fits 40, the other only 20: with reduce_min a size fits only if it fit everywhere
    other = oom_above(20)
    seen, reduced = [], []

    def probe(b):
        seen.append(b)
        oom_above(40)(b)

    def reduce_min(ok):
        try:
            other(seen[-1])
            theirs = 1
        except torch.cuda.OutOfMemoryError:
            theirs = 0
        reduced.append(ok)
        return min(ok, theirs)

    res = find_micro_batch(probe, max_size=128, safety_margin=1.0, reduce_min=reduce_min, free=None)
    assert res.largest_ok == 20 and len(reduced) == len(res.probes)


def _best_error(target, world, max_micro, multiple, per_seq=1):
    best = None
    for m in range(multiple, max_micro + 1, multiple):
        for a in range(1, target // (m * world * per_seq) + 2):
            err = abs(m * a * world * per_seq - target)
            best = err if best is None else min(best, err)
    return best


def test_plan_batch_exact_or_closest_exhaustive():
    for multiple in (1, 2, 3):
        for max_micro in range(multiple, 11):
            for world in range(1, 7):
                for target in range(1, 65):
                    bp = plan_batch(max_micro, world, 128, target_effective_batch_size=target, multiple=multiple)
                    assert 1 <= bp.micro_batch <= max_micro and bp.micro_batch % multiple == 0
                    assert bp.effective_batch == bp.micro_batch * bp.grad_accum * world
                    assert bp.tokens_per_step == bp.effective_batch * 128
                    exact = [m for m in range(multiple, max_micro + 1, multiple) if target % (m * world) == 0]
                    if exact:
                        assert bp.effective_batch == target and bp.warning is None and bp.deviation == 0
                        assert bp.micro_batch == max(exact)  # lowered only as far as needed
                    else:
                        err = abs(bp.effective_batch - target)
                        assert err == _best_error(target, world, max_micro, multiple) > 0
                        assert f"{bp.deviation:+.2%}" in bp.warning and f"{target:,} sequences" in bp.warning
                        assert math.isclose(bp.deviation, (bp.effective_batch - target) / target)


def test_plan_batch_tokens_and_examples():
    for T in (16, 24, 32):
        for world in (1, 2, 4):
            for tokens in range(16, 1025, 8):
                bp = plan_batch(8, world, T, target_tokens_per_step=tokens)
                if tokens % (T * world) == 0:
                    assert bp.tokens_per_step == tokens and bp.warning is None
                else:
                    assert abs(bp.tokens_per_step - tokens) == _best_error(tokens, world, 8, 1, T)
                    assert "tokens" in bp.warning and "%" in bp.warning
    bp = plan_batch(64, 8, 1024, target_effective_batch_size=512)
    assert (bp.micro_batch, bp.grad_accum, bp.effective_batch) == (64, 1, 512)
    bp = plan_batch(24, 8, 1024, target_effective_batch_size=512)
    assert (bp.micro_batch, bp.grad_accum) == (16, 4) and bp.note is None
    bp = plan_batch(16, 4, 2048, target_tokens_per_step=131072)
    assert (bp.micro_batch, bp.grad_accum, bp.tokens_per_step) == (16, 1, 131072)
    bp = plan_batch(64, 1, 128, target_effective_batch_size=1009)  # a prime: exact only with micro 1
    assert (bp.micro_batch, bp.grad_accum) == (1, 1009) and bp.warning is None and "lowered" in bp.note
    bp = plan_batch(8, 4, 128, grad_accum=3)  # no target
    assert (bp.micro_batch, bp.grad_accum, bp.effective_batch, bp.target) == (8, 3, 96, None)


def test_batch_args_validation():
    with pytest.raises(ConfigError, match="target_tokens_per_step"):
        BatchArgs(target_effective_batch_size=8, target_tokens_per_step=1024)
    for kw, key in (({"micro_batch_size": 0}, "micro_batch_size"),
                    ({"batch_safety_margin": 1.5}, "batch_safety_margin"),
                    ({"micro_batch_multiple": 0}, "micro_batch_multiple"),
                    ({"target_tokens_per_step": 0}, "target_tok"),
                    ({"max_micro_batch_size": 4, "micro_batch_multiple": 8}, "max_micro_batch_size"),
                    ({"curriculum": []}, "curriculum")):
        with pytest.raises(ConfigError, match=key):
            BatchArgs(**kw)
    assert BatchArgs().max_micro_batch_size == 1024 and fp8_micro_multiple(2048) == 1
    assert fp8_micro_multiple(100) == 4 and micro_multiple(BatchArgs(micro_batch_multiple=6), 100, 16) == 12
    assert micro_multiple(BatchArgs(micro_batch_multiple=6), 100, 32) == 24  # MXFP8: 32-token alignment
    assert micro_multiple(BatchArgs(micro_batch_multiple=6), 100) == 6  # no FP8


def test_cache_hit_skips_probing_and_reuses_the_boundary(tmp_path):
    calls = []
    fields = {"model_shape": "x", "seq_length": 64}
    kw = dict(max_size=64, safety_margin=1.0, run_dir=tmp_path / "run")

    def search():
        return find_micro_batch(oom_above(12, calls), max_size=64, safety_margin=1.0, free=None)

    res, hit = get_or_find(fields, search, **kw)
    assert (res.micro_batch, hit) == (12, False) and calls
    n = len(calls)
    res, hit = get_or_find(fields, search, **kw)
    assert (res.micro_batch, hit, len(calls)) == (12, True, n)
    res, hit = get_or_find(fields, search, max_size=64, safety_margin=1.0, run_dir=tmp_path / "other_run")
    assert (res.micro_batch, hit) == (12, True)  # from the user cache; copied into the new run dir
    assert (tmp_path / "other_run" / "batch_cache.json").is_file()
    res, hit = get_or_find(fields, search, max_size=8, safety_margin=0.5, run_dir=tmp_path / "run")
    assert (res.micro_batch, res.largest_ok, hit) == (8, 8, True)  # our smaller cap binds: no margin
    res, hit = get_or_find(fields, search, max_size=64, safety_margin=0.5, run_dir=tmp_path / "run")
    assert (res.micro_batch, hit, len(calls)) == (6, True, n)
    # a search that stopped at a smaller cap doesn't answer a larger one
    f2 = {"model_shape": "y"}
    get_or_find(f2, lambda: find_micro_batch(oom_above(100), max_size=16, free=None), max_size=16, safety_margin=1.0)
    res, hit = get_or_find(f2, search, max_size=64, safety_margin=1.0)
    assert not hit and res.largest_ok == 12
    # distributed: a rank without the entry makes everyone probe
    res, hit = get_or_find(fields, search, max_size=64, safety_margin=1.0, reduce_min=lambda x: 0, write=False)
    assert not hit and len(calls) > n


def test_cache_writers_global_rank0_run_dir_local_rank0_user_cache(tmp_path, monkeypatch):
    """Several nodes: node 1's local rank 0 fills its own (node-local) user cache but never the run
    dir's copy on the shared filesystem; global rank 0 writes both; other ranks neither."""
    fields = {"model_shape": "z", "seq_length": 64}

    def search():
        return find_micro_batch(oom_above(12), max_size=64, safety_margin=1.0, free=None)

    for who, write in (("rank0", (True, True)), ("node1_local0", (False, True)), ("node1_other", (False, False))):
        monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / who / "home"))
        get_or_find(fields, search, max_size=64, safety_margin=1.0, run_dir=tmp_path / who / "run", write=write)
        assert [(tmp_path / who / d / "batch_cache.json").is_file() for d in ("run", "home")] == list(write), who


def _tiny():
    from yxanul.models import YxanulForCausalLM, config_from_preset

    torch.manual_seed(0)
    return YxanulForCausalLM(config_from_preset("nano", 512, 32, backend="torch"))


def test_real_probe_on_cpu_trains_and_restores(monkeypatch):
    """The probe runs the trainer's own train_step (counted here), restores weights and settings."""
    import yxanul.training.step as step_mod

    model = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    steps, real_step = [], step_mod.train_step

    def counting_step(m, opt, batches, **kw):
        out = real_step(m, opt, batches, **kw)
        steps.append((batches[0][0].shape, bool(opt.state), m.activation_checkpointing))
        return out

    monkeypatch.setattr(step_mod, "train_step", counting_step)
    probe = TrainingProbe(model, seq_length=32, gradient_checkpointing=True, steps=2)
    probe(1)
    probe(2)
    assert [s[0] for s in steps] == [torch.Size([1, 32])] * 2 + [torch.Size([2, 32])] * 2
    assert all(opt_state and ckpt for _, opt_state, ckpt in steps)  # optimizer state allocated, checkpointing on
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # lr 0 + restore
    assert not model.activation_checkpointing and all(p.grad is None for p in model.parameters())
    res = find_micro_batch(TrainingProbe(_tiny(), seq_length=16), max_size=2, free=None)
    assert res.micro_batch == 2 and [b for b, _, _ in res.probes] == [1, 2]


def test_resolve_batch(monkeypatch, tmp_path):
    bp = resolve_batch(BatchArgs(micro_batch_size=8, target_effective_batch_size=64), seq_length=128, world_size=2)
    assert (bp.micro_batch, bp.grad_accum) == (8, 4)
    bp = resolve_batch(BatchArgs(micro_batch_size=8, gradient_accumulation_steps=3), seq_length=128, world_size=2)
    assert (bp.micro_batch, bp.grad_accum) == (8, 3)
    lines = []
    bp = resolve_batch(BatchArgs(micro_batch_size=3, target_effective_batch_size=7), seq_length=128, world_size=2,
                       say=lines.append)
    # 7 = 3 x accum x 2 has no solution: the closest is 6 (accum 1; 8 would need micro 2 x accum 2, further
    # from the largest micro-batch at the same error), said in one warning line
    assert (bp.micro_batch, bp.grad_accum, bp.effective_batch) == (3, 1, 6)
    assert lines == ["warning: batch target 7 sequences per optimizer step can't be met exactly with micro-batches "
                     "<= 3 x world 2: using 6 (-14.29%)"]

    # FP8 plans (the decision itself needs TE to build the recipe; set it by hand): 16-token alignment,
    # 32 for MXFP8, and none without FP8
    from yxanul.precision import PrecisionArgs
    from yxanul.precision.plan import PrecisionPlan

    for recipe, fp8, align in (("delayed", True, 16), ("mxfp8", True, 32), ("mxfp8", False, 1)):
        plan = PrecisionPlan.__new__(PrecisionPlan)
        plan.__dict__.update(args=PrecisionArgs(use_fp8=True, fp8_recipe=recipe), fp8_enabled=fp8, base="bf16")
        assert plan.token_alignment == align
        if align > 1:
            with pytest.raises(ConfigError, match=f"multiple of {align}"):
                resolve_batch(BatchArgs(micro_batch_size=align // 2), plan=plan, seq_length=101, world_size=1)
        assert resolve_batch(BatchArgs(micro_batch_size=align), plan=plan, seq_length=101,
                             world_size=1).micro_batch == align
    # auto_batch_size on CPU: no OOM signal, so micro_batch_size is used without probing
    lines = []
    bp = resolve_batch(BatchArgs(micro_batch_size=2, auto_batch_size=True, target_effective_batch_size=8),
                       model=_tiny(), seq_length=32, world_size=1, say=lines.append)
    assert (bp.micro_batch, bp.grad_accum) == (2, 4) and "nothing signals out-of-memory" in " ".join(lines)
    # the search + cache glue, as on a GPU (the real probe runs on the CPU, capped at 2)
    monkeypatch.setattr(bf, "_oom_signal", lambda device: True)
    args = BatchArgs(micro_batch_size=1, auto_batch_size=True, max_micro_batch_size=2, target_effective_batch_size=8)
    for expect_hit in (False, True):
        lines = []
        bp = resolve_batch(args, model=_tiny(), seq_length=32, world_size=1, run_dir=tmp_path, say=lines.append)
        assert (bp.micro_batch, bp.grad_accum) == (2, 4)
        assert ("from the cache" in lines[-1]) == expect_hit, lines
    assert (tmp_path / "batch_cache.json").is_file()
    assert cache_fields(_tiny().config, seq_length=32, precision="fp32", world_size=1,
                        gradient_checkpointing=False)["device"] == "cpu"


def test_find_batch_cli_on_cpu(capsys):
    rc = fb.main(["--model", "nano", "--seq_length", "32", "--max_micro_batch_size", "4", "--vocab_size", "512",
                  "--target_effective_batch_size", "16", "--backend", "torch"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "no out-of-memory signal" in out and "micro  result" in out
    assert [line.split()[:2] for line in out.splitlines() if line.strip()[:1].isdigit()] == \
        [["1", "ok"], ["2", "ok"], ["4", "ok"]]
    assert "plan: micro 4 x accumulation 4 x world 1 = 16 sequences x 32 = 512 tokens" in out
    assert "total" in out.splitlines()[-1]


def test_find_batch_without_arguments_probes_the_default_run_bounded_on_cpu(capsys):
    """`yxanul find-batch` alone: the run `yxanul train` resolves (nano, the bundled 8k tokenizer, seq 128),
    and on a CPU the search stops at the run's own micro x accumulation (8), saying so in one line."""
    if torch.cuda.is_available():
        pytest.skip("the CPU bound")
    assert fb.main([]) == 0
    out = capsys.readouterr().out
    assert "CPU: no out-of-memory signal here, so the search stops at 8 (the run's micro_batch_size x " \
           "gradient_accumulation_steps per process" in out
    assert "probing nano (torch, fp32, vocab 8,192, seq_length 128, checkpointing False) up to 8 on cpu" in out
    assert [line.split()[:2] for line in out.splitlines() if line.strip()[:1].isdigit()] == \
        [["1", "ok"], ["2", "ok"], ["4", "ok"], ["8", "ok"]]


def test_find_batch_probes_the_vocabulary_of_a_prepared_data_dir_as_train_would(tmp_path, capsys):
    """A data_dir given alone: train builds the embedding of its meta.json's vocab_size; find-batch read only the
    tokenizer key (the bundled 8,192 here), so it probed another model."""
    import json

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "meta.json").write_text(json.dumps({"vocab_size": 1234}))
    assert fb.main(["--model", "nano", "--seq_length", "32", "--max_micro_batch_size", "1", "--backend", "torch",
                    "--data_dir", str(tmp_path / "d")]) == 0
    assert "probing nano (torch, fp32, vocab 1,234, seq_length 32" in capsys.readouterr().out


def test_find_batch_without_a_target_says_the_effective_batch_it_changes(capsys):
    """No target: a run keeps gradient_accumulation_steps, so the micro-batch found multiplies the batch."""
    assert fb.main(["--model", "nano", "--seq_length", "32", "--vocab_size", "512", "--backend", "torch",
                    "--micro_batch_size", "2", "--gradient_accumulation_steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "plan: micro 8 x accumulation 4 x world 1 = 32 sequences" in out
    assert "8 sequences a step as configured, 32 with micro-batch 8 (set target_effective_batch_size 8 to keep it)" \
        in out


def test_cpu_memory_budget_stops_the_search_before_the_memory_runs_out():
    """A fresh process, real allocations (size x 40 MB, written) and its real peak RSS: with a budget of
    300 MB above the start the search stops before a probe would pass it (size 8 = 320 MB never runs)."""
    import subprocess
    import sys

    code = """
import sys
from yxanul.tools.find_batch import MemoryBudget, OverBudget
from yxanul.training.batching.search import find_micro_batch
budget = MemoryBudget()
budget.limit = budget.base + 300 * 2**20
ran = []
def probe(size):
    block = b"\\x01" * (size * 40 * 2**20)
    ran.append(size)
    del block
res = find_micro_batch(budget.wrap(probe), max_size=64, safety_margin=1.0, free=None,
                       is_oom=lambda e: isinstance(e, OverBudget))
print(res.largest_ok, max(ran))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    largest, most = map(int, r.stdout.split())
    assert 4 <= largest < 8 and most < 8, r.stdout


def test_curriculum_searches_each_stage(monkeypatch, tmp_path):
    """auto_batch_size + curriculum: every stage's micro-batch is searched (and cached) at its own
    seq_length. The real CPU probe runs, wrapped to raise OOM above an attention-like budget
    (B x T^2 > 2048), where keeping the base plan's tokens per micro-batch would under-fill the
    short stage (micro 4 instead of the 8 that fit)."""
    from yxanul.config import resolve
    real = bf.TrainingProbe

    def quadratic_budget_probe(model, *, seq_length, **kw):
        inner = real(model, seq_length=seq_length, **kw)

        def probe(b):
            if b * seq_length ** 2 > 2048:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
            return inner(b)
        probe.peak_bytes = inner.peak_bytes
        return probe

    monkeypatch.setattr(bf, "TrainingProbe", quadratic_budget_probe)
    monkeypatch.setattr(bf, "_oom_signal", lambda device: True)
    cfg = resolve({"curriculum": [{"seq_length": 16, "until_steps": 2}, {"seq_length": 32}],
                   "seq_length": 32, "auto_batch_size": True, "max_micro_batch_size": 16, "batch_safety_margin": 1.0,
                   "target_tokens_per_step": 256})
    model, lines = _tiny(), []
    batch = resolve_batch(cfg.batch, model=model, seq_length=32, world_size=1, run_dir=tmp_path, say=lines.append)
    assert (batch.micro_batch, batch.grad_accum) == (2, 4)
    cur, plans = plan_curriculum(cfg, batch, 256, 1, lines.append, model=model, run_dir=tmp_path)
    assert [(p.micro_batch, p.grad_accum, p.tokens_per_step) for p in plans] == [(8, 2, 256), (2, 4, 256)]
    assert any("at seq_length 16" in line for line in lines)  # a search at the stage's length...
    assert sum("from the cache" in line for line in lines) == 1  # ...and the base length reused the first
    # without auto_batch_size the stages keep the base plan's tokens per micro-batch
    cfg.batch.auto_batch_size = False
    _, plans = plan_curriculum(cfg, batch, 256, 1, lines.append, model=model, run_dir=tmp_path)
    assert [(p.micro_batch, p.grad_accum) for p in plans] == [(4, 4), (2, 4)]


def test_find_batch_probes_with_the_speed_defaults_the_run_would_get(capsys):
    """The probe measures the run's own loss implementation and weights (they change its memory): the table's
    flags apply as in `yxanul train`, cuda_graphs held off since the probes change the micro-batch."""
    from yxanul.training.speed_defaults import check_table

    table = check_table({"torch": {"nano": {"flags": "--loss_impl chunked --cuda_graphs", "evidence": "x"}}},
                        backends=("te", "torch"))
    argv = ["--model", "nano", "--seq_length", "32", "--max_micro_batch_size", "2", "--vocab_size", "512",
            "--backend", "torch"]
    assert fb.main(argv, speed_table=table) == 0
    out = capsys.readouterr().out
    assert ("speed defaults for torch/nano (x): --loss_impl chunked; kept off: cuda_graphs (the micro-batch or "
            "seq_length changes (curriculum / batch finder))") in out
    assert [line.split()[:2] for line in out.splitlines() if line.strip()[:1].isdigit()] == [["1", "ok"], ["2", "ok"]]
    assert fb.main([*argv, "--loss_impl", "default"], speed_table=table) == 0  # the user's flag wins
    assert "speed defaults for torch/nano (x): none applied; kept off: cuda_graphs" in capsys.readouterr().out


def test_the_cpu_search_stops_at_the_runs_own_sequences_per_process(capsys):
    """On a CPU the search's cap is the sequences one process uses per step: the target over all processes,
    divided by their number (8192 tokens at 64 per sequence = 128 sequences: 64 each on 2), never above the
    max_micro_batch_size, rounded down to the multiple."""
    from yxanul.training.batching import BatchArgs

    assert fb.cpu_bound(BatchArgs(target_tokens_per_step=8192), 64, 2, 8)[0] == 64
    assert fb.cpu_bound(BatchArgs(target_tokens_per_step=8192), 64, 1, 8)[0] == 128
    assert fb.cpu_bound(BatchArgs(target_effective_batch_size=100), 64, 4, 8)[0] == 24  # 25 per process -> 24
    assert fb.cpu_bound(BatchArgs(micro_batch_size=4, gradient_accumulation_steps=3, max_micro_batch_size=8),
                        64, 2, 1)[0] == 8
    capsys.readouterr()
