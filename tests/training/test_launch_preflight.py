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
    # before the process group: rank 0 prints it once per job (after it, every rank would)
    (["--master_weights", "fp32", "--mixed_precision", "bf16"], {"WORLD_SIZE": "2"},
     "config key 'master_weights': expected none with 2 processes \\(DDP\\)"),
    (["--master_weights", "fp32", "--mixed_precision", "bf16"], {"ACCELERATE_USE_DEEPSPEED": "true"},
     "config key 'master_weights': expected none under DeepSpeed"),
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
    assert said == []


def test_a_hub_repository_without_push_to_hub_is_said():
    """--hub_model_id alone pushed nothing and said nothing; with --push_to_hub there is nothing to say."""
    said = []
    preflight(parse_args(["--hub_model_id", "me/tiny"]), say=said.append, env={}, cuda_available=False)
    assert len(said) == 1 and said[0].startswith("note: hub_model_id me/tiny is set but push_to_hub is false")
    preflight(parse_args(["--hub_model_id", "me/tiny", "--push_to_hub"]), say=said.append, env={},
              cuda_available=False)
    assert len(said) == 1


def test_an_error_in_the_launch_environment_stops_before_anything_is_built(tmp_path):
    """What `check_launch_environment` calls an error (here a DeepSpeed config file that is not there) is a
    one-line refusal, not a warning the run goes past."""
    from yxanul.errors import UserError

    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(tmp_path / "none.json")}
    with pytest.raises(UserError, match=r"^environment: ACCELERATE_DEEPSPEED_CONFIG_FILE: .*none\.json not"):
        preflight(parse_args([]), say=lambda *a: None, env=env, cuda_available=False)


def test_launcher_variables_left_in_a_shell_are_one_line_before_anything_reads_them(tmp_path, monkeypatch, capsys):
    """A WORLD_SIZE with no launcher (no MASTER_ADDR: accelerate's multi-line ValueError) and launcher variables
    that are no numbers (int() in the speed defaults: an internal error) stop `yxanul train` in one line, exit 2;
    what torchrun exports passes."""
    from yxanul.cli import main as cli
    from yxanul.training.launch import check_process_env

    check_process_env({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                       "MASTER_PORT": "29500"})
    check_process_env({})
    cases = [({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 in the environment but no MASTER_ADDR: start several processes "
                                   "with `yxanul launch`"),
             ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' in the environment: expected a whole number"),
             ({"RANK": "x"}, "RANK='x' in the environment: expected a whole number"),
             ({"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "p"}, "MASTER_PORT='p'")]
    for env, needle in cases:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            assert cli(["train", "--max_steps", "1", "--output_dir", str(tmp_path / "r")]) == 2, env
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {needle}"), (env, err)
    assert not (tmp_path / "r").exists()


def test_a_launch_warning_names_its_severity_once():
    """`warning: environment: KEY: ...`, not `warning: environment: warning: KEY` (the lint line carries it too)."""
    said = []
    preflight(parse_args(["--use_fp8"]), say=said.append, env={"ACCELERATE_MIXED_PRECISION": "bf16"},
              cuda_available=False)
    assert said and said[0].startswith("warning: environment: ACCELERATE_MIXED_PRECISION: accelerate launch says"), said
