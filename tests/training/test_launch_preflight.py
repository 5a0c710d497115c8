"""`preflight`: launch-level refusals before anything is built, read from what `accelerate launch` exports."""

import pytest

from yxanul.config import parse_args
from yxanul.errors import ConfigError
from yxanul.training.launch import preflight

FSDP2 = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}


@pytest.mark.parametrize("flags, env, expected", [
    (["--fp8_weight_all_gather", "--use_fp8", "--fuse_qkv_params", "--backend", "te"], {},
     "config key 'fp8_weight_all_gather': expected false outside an FSDP2 launch"),
    (["--cuda_graphs"], FSDP2, "config key 'cuda_graphs': expected false under FSDP2"),
    (["--fuse_qkv_rope"], FSDP2, "config key 'fuse_qkv_rope': expected false under FSDP2 .*grouped rows"),
    (["--fuse_qkv_rope"], {"ACCELERATE_USE_DEEPSPEED": "true"}, "config key 'fuse_qkv_rope': expected false under "
                                                                "DeepSpeed"),
])
def test_a_launch_that_cannot_run_the_config_is_one_line(flags, env, expected):
    with pytest.raises(ConfigError, match=f"^{expected}"):
        preflight(parse_args(flags), say=lambda *a: None, env=env, cuda_available=False)


def test_the_same_configs_pass_where_they_can_run():
    said = []
    preflight(parse_args(["--cuda_graphs"]), say=said.append, env={}, cuda_available=False)
    preflight(parse_args(["--fuse_qkv_rope"]), say=said.append, env={"WORLD_SIZE": "2"}, cuda_available=False)  # DDP
    preflight(parse_args(["--fp8_weight_all_gather", "--use_fp8", "--fuse_qkv_params", "--backend", "te"]),
              say=said.append, env=FSDP2, cuda_available=False)


def test_an_error_in_the_launch_environment_stops_before_anything_is_built(tmp_path):
    """What `check_launch_environment` calls an error (here a DeepSpeed config file that is not there) is a
    one-line refusal, not a warning the run goes past."""
    from yxanul.errors import UserError

    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(tmp_path / "none.json")}
    with pytest.raises(UserError, match=r"^environment: error: ACCELERATE_DEEPSPEED_CONFIG_FILE: .*none\.json not"):
        preflight(parse_args([]), say=lambda *a: None, env=env, cuda_available=False)
