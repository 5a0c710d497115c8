"""Micro-batch search with an injected OOM probe, accumulation math, cache, real CPU probe, CLI."""

import math
import subprocess
import sys

import pytest
import torch

from yxanul.batch_finder import (BatchArgs, cached_search, find_micro_batch, make_training_probe, plan_batch,
                                 resolve_batch)
from yxanul.errors import ConfigError


def oom_above(limit, calls=None):
    def probe(b):
        if calls is not None:
            calls.append(b)
        if b > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return probe


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 8, 13, 31, 64, 100, 255, 256])
def test_search_finds_exact_boundary_with_few_probes(limit):
    res = find_micro_batch(oom_above(limit), max_size=256, safety_margin=1.0)
    assert res.largest_ok == limit and res.micro_batch == limit
    assert len(res.probes) <= 2 * math.ceil(math.log2(256)) + 2


def test_safety_margin_and_multiple():
    res = find_micro_batch(oom_above(100), max_size=256, safety_margin=0.9)
    assert res.largest_ok == 100 and res.micro_batch == 90
    res = find_micro_batch(oom_above(100), max_size=256, multiple=8, safety_margin=1.0)
    assert res.largest_ok == 96 and all(b % 8 == 0 for b, _, _ in res.probes)
    res = find_micro_batch(oom_above(10_000), max_size=64, safety_margin=0.9)
    assert res.micro_batch == 64 and res.smallest_fail is None  # no OOM seen: no margin needed


def test_non_oom_errors_propagate_and_total_failure_is_clear():
    def broken(b):
        raise ValueError("shape mismatch")
    with pytest.raises(ValueError, match="shape mismatch"):
        find_micro_batch(broken, max_size=8)
    with pytest.raises(RuntimeError, match="does not fit"):
        find_micro_batch(oom_above(0), max_size=8)


def test_ranks_agree_on_the_minimum():
    # this rank fits 40, another only 20: reduce_min makes a probe fail if it failed anywhere
    other_limit = 20
    assert find_micro_batch(oom_above(40), max_size=128, safety_margin=1.0).largest_ok == 40
    seen = []

    def probe(b):
        seen.append(b)
        oom_above(40)(b)

    res = find_micro_batch(probe, max_size=128, safety_margin=1.0,
                           reduce_min=lambda ok: min(ok, int(seen[-1] <= other_limit)))
    assert res.largest_ok == other_limit


def test_plan_batch_exact_or_closest_with_warning():
    for target in range(1, 70):
        for world in (1, 2, 3, 4, 8):
            for max_micro in (1, 3, 8, 16):
                bp = plan_batch(max_micro, world, 128, target_effective_batch_size=target)
                assert 1 <= bp.micro_batch <= max_micro
                if bp.effective_batch == target:
                    assert bp.warning is None
                else:
                    # no exact combination exists with micro <= max_micro
                    assert not any(target % (m * world) == 0 for m in range(1, max_micro + 1))
                    assert "%" in bp.warning and str(target) in bp.warning
    bp = plan_batch(64, 8, 1024, target_effective_batch_size=512)
    assert (bp.micro_batch, bp.grad_accum, bp.effective_batch) == (64, 1, 512)
    bp = plan_batch(24, 8, 1024, target_effective_batch_size=512)
    assert bp.micro_batch * bp.grad_accum * 8 == 512 and bp.micro_batch <= 24
    bp = plan_batch(16, 4, 2048, target_tokens_per_step=131072)
    assert bp.tokens_per_step == 131072


def test_batch_args_validation():
    with pytest.raises(ConfigError, match="target_tokens_per_step"):
        BatchArgs(target_effective_batch_size=8, target_tokens_per_step=1024)
    with pytest.raises(ConfigError, match="micro_batch_size"):
        BatchArgs(micro_batch_size=0)


def test_cache_hit_skips_probing(tmp_path, monkeypatch):
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "user"))
    calls = []

    def search():
        return find_micro_batch(oom_above(12, calls), max_size=64, safety_margin=1.0)

    assert cached_search("k1", tmp_path / "run", search) == (12, False)
    n = len(calls)
    assert cached_search("k1", tmp_path / "run", search) == (12, True) and len(calls) == n
    assert cached_search("k1", tmp_path / "other_run", search) == (12, True)  # the user-level cache


def test_real_probe_on_cpu_restores_weights():
    from yxanul.models import YxanulForCausalLM, config_from_preset

    model = YxanulForCausalLM(config_from_preset("tiny", 512, 32))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = make_training_probe(model, 32)
    probe(1)
    probe(2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_resolve_batch_targets():
    bp = resolve_batch(BatchArgs(micro_batch_size=8, target_effective_batch_size=64), seq_length=128, world_size=2)
    assert (bp.micro_batch, bp.grad_accum) == (8, 4)
    bp = resolve_batch(BatchArgs(micro_batch_size=8, gradient_accumulation_steps=3), seq_length=128, world_size=2)
    assert (bp.micro_batch, bp.grad_accum) == (8, 3)


def test_find_batch_cli_on_cpu():
    r = subprocess.run([sys.executable, "-m", "yxanul", "find-batch", "--model", "tiny", "--seq_length", "32",
                        "--max_micro_batch_size", "4", "--vocab_size", "512", "--target_effective_batch_size", "16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "nothing runs out of memory" in r.stdout
    assert "plan: micro 4 x accumulation 4 x world 1 = 16 sequences" in r.stdout
