"""`yxanul._te`'s process-wide settings that need no Transformer Engine to check: the RMSNorm kernel choice
(``norm_kernel``; its effect on a GPU: tests/models/test_norm_kernel_gpu.py)."""

import pytest

from yxanul import _te
from yxanul.errors import ConfigError
from yxanul.models import config_from_preset
from yxanul.models.args import ModelArgs


@pytest.fixture
def fresh(monkeypatch):
    """A process that has built no TE model yet, with TE's two switches unset (restored afterwards)."""
    monkeypatch.setattr(_te, "_norm_kernel", None)
    for var in _te.CUDNN_NORM_ENV:
        monkeypatch.setenv(var, "")  # "" is unset to TE (its getenv returns the default) and restores at teardown
    return monkeypatch


def _env():
    import os

    return [os.environ.get(v) for v in _te.CUDNN_NORM_ENV]


def test_cudnn_sets_both_of_te_s_switches_and_the_first_choice_holds(fresh):
    _te.use_norm_kernel("cudnn")
    assert _env() == ["1", "1"]
    _te.use_norm_kernel("cudnn")  # every layer of the model asks again
    with pytest.raises(ConfigError, match=r"^config key 'norm_kernel': expected cudnn: TE takes one normalization "
                                          r"backend per process \(an earlier model of this process\), got 'te'"):
        _te.use_norm_kernel("te")
    assert _env() == ["1", "1"]


def test_te_kernels_leave_the_switches_alone_and_refuse_a_later_cudnn(fresh):
    _te.use_norm_kernel("te")
    assert _env() == ["", ""]
    with pytest.raises(ConfigError, match="expected te: TE takes one normalization backend per process"):
        _te.use_norm_kernel("cudnn")
    assert _env() == ["", ""]  # not half-switched after TE's kernels may have run


def test_a_switch_set_in_the_environment_is_the_process_s_choice(fresh):
    fresh.setenv("NVTE_NORM_FWD_USE_CUDNN", "1")
    with pytest.raises(ConfigError, match=r"expected cudnn: .*\(NVTE_NORM_FWD_USE_CUDNN=1 in the environment\)"):
        _te.use_norm_kernel("te")
    _te.use_norm_kernel("cudnn")  # and asking for it turns the backward on too
    assert _env() == ["1", "1"]
    fresh.setattr(_te, "_norm_kernel", None)
    fresh.setenv("NVTE_NORM_FWD_USE_CUDNN", "0")  # TE reads 0 as off; the backward one is still on
    with pytest.raises(ConfigError, match=r"\(NVTE_NORM_BWD_USE_CUDNN=1 in the environment\)"):
        _te.use_norm_kernel("te")
    fresh.setenv("NVTE_NORM_BWD_USE_CUDNN", "0")
    _te.use_norm_kernel("te")


def test_norm_kernel_is_checked_where_it_is_given():
    with pytest.raises(ConfigError, match="^config key 'norm_kernel': expected one of te, cudnn, got 'apex'"):
        ModelArgs(norm_kernel="apex")
    with pytest.raises(ConfigError, match="^config key 'norm_kernel': expected one of te, cudnn"):
        config_from_preset("nano", 1024, 64, norm_kernel="triton")
    # the torch backend keeps it (a config.json made on a GPU loads on a CPU) and ignores it
    assert config_from_preset("nano", 1024, 64, norm_kernel="cudnn").norm_kernel == "cudnn"


def _group_step_optimizer(params):
    """What FusedAdam (CUDA only) does that the resume depends on: ``initialize_state`` makes a parameter's state,
    and the step count lives in each param group, made at the first step (TE 2.20 fused_adam.py)."""
    import torch

    class GroupStep(torch.optim.SGD):
        def initialize_state(self, p, store_param_remainders):
            self.state[p]["exp_avg"] = torch.zeros_like(p)

        def step(self, closure=None):
            for g in self.param_groups:
                g["step"] = g["step"] + 1 if "step" in g else 1
            return super().step(closure)

    return GroupStep(params, lr=0.1)


def test_a_group_step_count_survives_the_resume_of_every_initialized_state(tmp_path):
    """`initialize_every_state` before a resume: torch's get_optimizer_state_dict is the template DCP loads into,
    and only its keys are read. The group's step count must be one of them, or the first resumed step of
    FusedAdam bias-corrects as step 1 (the FSDP2 FP8-weight resume on the H200, 2026-11-27.4)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    def built():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        opt = _group_step_optimizer(model.parameters())
        _te.initialize_every_state(opt)  # as training/fsdp.py prepares FP8 weights
        return model, opt

    model, opt = built()
    for _ in range(3):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    dcp.save({"optimizer": get_optimizer_state_dict(model, opt)}, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    model, opt = built()  # a new process resuming
    template = {"optimizer": get_optimizer_state_dict(model, opt)}
    dcp.load(template, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    set_optimizer_state_dict(model, opt, template["optimizer"])
    assert [g.get("step") for g in opt.param_groups] == [3]
