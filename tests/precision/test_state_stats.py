"""Checkpoint helpers (no pickled TE extra state) and FP8 statistics, on stand-ins of TE modules.

The stand-in mimics TE 2.20 `module/base.py`: `fp8_meta` dict with DelayedScalingRecipeState-like
`scale` [n] / `amax_history` [len, n], `_fp8_workspaces` (cached FP8 weights) and get/set_extra_state
that pickle / refuse to unpickle. The cached weights are TE's own storage classes where TE imports
(marker `te`, CPU is enough) and objects with their attribute names elsewhere.
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


def _workspaces(f8, mx, block):
    """One cached weight per storage kind, with garbage in the padding TE leaves uninitialised."""
    e = torch.full((128, 4), 255, dtype=torch.uint8)   # MXFP8 [M=128, K=64]: [128, 64/32=2] real, padded to 4
    e[:, :2] = 127                                     # scale_inv 2**0 -> scale 1
    e[0, 0], e[1, 1] = 120, 130                        # scale 2**7 = 128 and 2**-3
    b = torch.full((2, 4), -1.0)                       # block 2D [M=256, K=200]: [2, ceil(200/128)=2] real
    b[:, :2] = torch.tensor([[0.5, 0.25], [2.0, 0.125]])  # scales 2, 4, 0.5, 8
    return {"weight": f8(torch.tensor([0.125])),                                   # scale 8
            "fc1_weight": mx(torch.zeros(128, 64, dtype=torch.uint8), e, False),
            "fc2_weight": block(torch.zeros(256, 200, dtype=torch.uint8), b, True)}


def _check_weight_stats(m):
    s = fp8_stats(m)
    assert s["weight_tensors"] == 3.0 and s["nonfinite"] == 0.0
    assert s["weight_scale_min"] == 0.125 and s["weight_scale_max"] == 128.0
    assert s["weight_scale_median"] == 2.0  # of the per-tensor medians 8, 1, 2 (torch: the lower middle)
    assert "scale_min" not in s  # no delayed-scaling state in a stateless recipe


def test_fp8_stats_read_cached_fp8_weights_of_stateless_recipes():
    m = FakeTE()
    m.fp8_meta = {"scaling_fwd": SimpleNamespace(), "scaling_bwd": SimpleNamespace()}
    m._fp8_workspaces = _workspaces(
        lambda sinv: SimpleNamespace(_scale_inv=sinv),
        lambda data, sinv, swz: SimpleNamespace(_rowwise_data=data, _rowwise_scale_inv=sinv,
                                                _with_gemm_swizzled_scales=swz),
        lambda data, sinv, two_d: SimpleNamespace(_rowwise_data=data, _rowwise_scale_inv=sinv, _is_2D_scaled=two_d))
    _check_weight_stats(m)
    m._fp8_workspaces["weight"]._scale_inv = torch.tensor([0.0])  # scale inf
    assert fp8_stats(m)["nonfinite"] == 1.0 and fp8_stats(m)["weight_tensors"] == 2.0
    m._fp8_workspaces["fc1_weight"]._with_gemm_swizzled_scales = True  # swizzled + padded: skipped
    assert fp8_stats(m)["weight_tensors"] == 1.0


@pytest.mark.te
def test_fp8_stats_read_te_storage_classes():
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage
    from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import Float8TensorStorage
    from transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage

    e4m3 = tex.DType.kFloat8E4M3
    m = FakeTE()
    m.fp8_meta = {}
    m._fp8_workspaces = _workspaces(
        lambda sinv: Float8TensorStorage(data=torch.zeros(4, 4, dtype=torch.uint8), fp8_scale_inv=sinv, fp8_dtype=e4m3),
        lambda data, sinv, swz: MXFP8TensorStorage(data, sinv, None, None, e4m3, None, swz),
        lambda data, sinv, two_d: Float8BlockwiseQTensorStorage(data, sinv, None, None, e4m3, None, two_d))
    _check_weight_stats(m)
