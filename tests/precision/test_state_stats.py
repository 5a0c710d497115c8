"""Checkpoint helpers (no pickled TE extra state) and FP8 statistics, on stand-ins of TE modules.

The stand-in mimics TE 2.20 `module/base.py`: `fp8_meta` dict with DelayedScalingRecipeState-like
`scale` [n] / `amax_history` [len, n], and get/set_extra_state that pickle / refuse to unpickle.
"""

import pickle
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from yxanul.precision import fp8_stats
from yxanul.precision.state import fp8_state_dict, load_fp8_state_dict, no_pickled_extra_state


class FakeTE(torch.nn.Module):
    def __init__(self, n=3, hist=4):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 16))
        self.fp8_meta = {"fp8_checkpoint": True,
                         "scaling_fwd": SimpleNamespace(scale=torch.ones(n), amax_history=torch.zeros(hist, n)),
                         "scaling_bwd": SimpleNamespace(scale=torch.ones(2), amax_history=torch.zeros(hist, 2))}

    def get_extra_state(self):  # TE: pickled recipe + tensors
        return torch.frombuffer(bytearray(pickle.dumps({"recipe": "DelayedScaling"})), dtype=torch.uint8)

    def set_extra_state(self, state):  # TE: empty is a no-op, a pickle is refused
        if state is None or state.numel() == 0:
            return
        raise RuntimeError("Refusing to load pickled Transformer Engine extra state")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layernorm_qkv, self.proj = FakeTE(), FakeTE()


def test_unpatched_stand_in_behaves_like_te():
    sd = Block().state_dict()
    assert sd["proj._extra_state"].numel() > 0
    with pytest.raises(RuntimeError, match="Refusing"):
        Block().load_state_dict(sd)


def test_no_pickled_extra_state_round_trip_through_safetensors(tmp_path):
    src = Block()
    assert no_pickled_extra_state(src) == 2 and no_pickled_extra_state(src) == 0  # idempotent
    sd = src.state_dict()
    assert sd["proj._extra_state"].numel() == 0 and sd["proj._extra_state"].dtype == torch.uint8
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "m.safetensors"))
    dst = Block()
    no_pickled_extra_state(dst)
    dst.load_state_dict(load_file(str(tmp_path / "m.safetensors")))
    assert torch.equal(dst.proj.weight, src.proj.weight)
    Block().load_state_dict(sd)  # an unpatched TE module also accepts the empty extra state
    foreign = Block().state_dict()  # a pickle from elsewhere still reaches TE's refusal
    with pytest.raises(RuntimeError, match="Refusing"):
        dst.load_state_dict(foreign)


def test_fp8_state_file_round_trip(tmp_path):
    src = Block()
    src.proj.fp8_meta["scaling_fwd"].scale.copy_(torch.tensor([2.0, 3.0, 4.0]))
    src.proj.fp8_meta["scaling_fwd"].amax_history[1] = torch.tensor([0.5, 0.25, 0.0])
    save_file(fp8_state_dict(src), str(tmp_path / "fp8_state.safetensors"))
    dst = Block()
    assert load_fp8_state_dict(dst, load_file(str(tmp_path / "fp8_state.safetensors"))) == 8
    assert torch.equal(dst.proj.fp8_meta["scaling_fwd"].scale, torch.tensor([2.0, 3.0, 4.0]))
    short = Block()
    short.proj.fp8_meta["scaling_fwd"].amax_history = torch.zeros(2, 3)  # other history length: skipped
    assert load_fp8_state_dict(short, fp8_state_dict(src)) == 7


def test_fp8_stats_skip_unused_slots_and_count_nonfinite():
    m = Block()
    fwd = m.proj.fp8_meta["scaling_fwd"]
    fwd.scale.copy_(torch.tensor([448.0, 4480.0, 1.0]))           # slot 2 (GEMM output) never used
    fwd.amax_history[-1] = torch.tensor([1.0, 0.1, 0.0])          # latest amax after TE's roll
    m.layernorm_qkv.fp8_meta["scaling_bwd"].scale.copy_(torch.tensor([float("inf"), 8.0]))
    m.layernorm_qkv.fp8_meta["scaling_bwd"].amax_history[0] = torch.tensor([2.0, 7168.0])
    s = fp8_stats(m)
    assert s["scale_min"] == 8.0 and s["scale_max"] == 4480.0 and s["nonfinite"] == 1.0
    assert s["amax_min"] == pytest.approx(0.1) and s["amax_max"] == 7168.0 and s["tensors"] == 3.0
    assert fp8_stats(torch.nn.Linear(4, 4)) == {}


def test_fp8_stats_stateless_recipe_is_empty():
    m = FakeTE()
    m.fp8_meta = {"scaling_fwd": SimpleNamespace(), "scaling_bwd": SimpleNamespace()}  # current/block/MXFP8
    assert fp8_stats(m) == {}
