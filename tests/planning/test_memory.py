"""The per-strategy model state against real sharding: FSDP2's ``fully_shard`` on the meta device over
a fake process group of 16 ranks (nothing allocated, no other process): its local shards are what the
planner counts."""

import pytest
import torch
import torch.distributed as dist

from yxanul.models import YxanulForCausalLM, config_from_preset, count_parameters
from yxanul.planning.memory import memory, model_shapes

fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")


@pytest.fixture
def fake_world():
    def start(world):
        dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=world)
    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def local_numel(model) -> int:
    return sum(p.to_local().numel() for p in model.parameters())


def shard(config, mesh=None):
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = YxanulForCausalLM(config)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


@pytest.mark.parametrize("preset", ["3b", "7b"])
def test_fsdp2_and_hsdp_weights_are_the_local_shards_of_fully_shard(fake_world, preset):
    from torch.distributed.device_mesh import init_device_mesh

    c = config_from_preset(preset, 50257, 4096, backend="torch")
    s = model_shapes(c)
    assert s.params == count_parameters(c)
    fake_world(16)
    kw = dict(micro=1, seq_length=4096, checkpointing=True, world=16, gpus_per_node=8)
    full = shard(c)
    assert memory("fsdp2", c, s, **kw).weights == 4 * local_numel(full)  # fp32 shards, 1/16 each
    mesh = init_device_mesh("cpu", (2, 8), mesh_dim_names=("replicate", "shard"))
    hsdp = shard(c, mesh)
    assert memory("hsdp", c, s, **kw).weights == 4 * local_numel(hsdp)  # sharded over the 8 of a node
    assert local_numel(hsdp) == 2 * local_numel(full)


def test_replicated_strategies_hold_everything():
    c = config_from_preset("3b", 50257, 2048, backend="torch")
    s = model_shapes(c)
    kw = dict(micro=1, seq_length=2048, checkpointing=False, gpus_per_node=8)
    one, ddp = memory("single", c, s, world=1, **kw), memory("ddp", c, s, world=8, **kw)
    assert one.weights == ddp.weights == 4 * s.params and one.optimizer == 8 * s.params
    assert one.buffers == 0 and ddp.buffers == 4 * s.params  # DDP's bucket copy of the gradients
    z1, z2, z3 = (memory(z, c, s, world=8, **kw) for z in ("zero1", "zero2", "zero3"))
    assert z1.gradients == 2 * s.params and z2.gradients == z3.gradients == 2 * s.params // 8
    assert z1.optimizer == z2.optimizer == z3.optimizer == 16 * s.params // 8
