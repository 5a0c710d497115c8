"""What yxanul's DeepSpeed setup (`import_deepspeed_quietly`) keeps out of a run's log."""

import importlib.util
import warnings

import pytest
import torch
import torch.distributed as dist

from yxanul._deepspeed import import_deepspeed_quietly


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_torchs_deprecation_of_the_collectives_deepspeed_calls_is_not_shown(tmp_path):
    """ZeRO all-gathers parameters and reduce-scatters gradients through the two collectives torch deprecated:
    their FutureWarnings filled a ZeRO-3 log every step on every rank. Those two are ignored once the trainers set
    DeepSpeed up; another torch deprecation (``_all_gather_base``) still shows."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        with warnings.catch_warnings(record=True) as seen:  # the filter goes with the block: no other test sees it
            import_deepspeed_quietly()
            out = torch.zeros(2)
            dist.all_gather_into_tensor(out, torch.ones(2))
            dist.reduce_scatter_tensor(torch.zeros(2), out)
            dist._all_gather_base(out, torch.ones(2))
    finally:
        dist.destroy_process_group()
    shown = [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]
    assert len(shown) == 1 and shown[0].startswith("`torch.distributed._all_gather_base` is a private function"), \
        shown
