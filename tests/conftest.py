"""Shared test setup: offline Hub; GPU/TE tests skipped with a reason where they can't run, slow ones unless asked;
the tiny training run every training test starts from (``fast``) and the real CLI in a subprocess (``yx``)."""

import os

import pytest
import torch
from tiny_run import FAST
from tiny_run import yx as run_cli

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true",
                     help="also run the tests marked slow (> ~20 s each on 2 CPU cores; ~20 min in all)")


def _runs_slow(config) -> bool:
    """Slow tests run with --runslow or YXANUL_SLOW=1, under a -m expression that names them, and on a GPU
    machine (the device checks choose them by marker); the default suite keeps a fast test of each."""
    return bool(config.getoption("--runslow") or os.environ.get("YXANUL_SLOW") == "1"
                or "slow" in (config.getoption("markexpr") or "") or torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    from yxanul import _te

    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine: scripts/device/README.md)")
    no_te = pytest.mark.skip(reason=f"needs Transformer Engine ({_te.TE_IMPORT_ERROR}); on a CPU: "
                                    "scripts/device/cpu_te_env.sh")
    slow = None if _runs_slow(config) else pytest.mark.skip(reason="slow: run with --runslow (or YXANUL_SLOW=1)")
    for item in items:
        if slow is not None and "slow" in item.keywords:
            item.add_marker(slow)
        elif "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        elif "te" in item.keywords and not _te.TE_AVAILABLE:
            item.add_marker(no_te)


@pytest.fixture
def tiny_config():
    """A small torch-backend YxanulConfig factory: `tiny_config(**overrides)` (vocab 1000 -> 1024, seq 64)."""
    from yxanul.models import config_from_preset

    def make(**overrides):
        overrides.setdefault("backend", "torch")
        return config_from_preset("nano", 1000, 64, **overrides)

    return make


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate's AcceleratorState/GradientState are process-wide singletons: a test that builds an
    Accelerator (in-process trainer, Trainer integration, checkpoint helpers) must not decide the
    mixed precision of the next one."""
    yield
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


@pytest.fixture(scope="session", autouse=True)
def _temp_files_under_basetemp(tmp_path_factory):
    """What the code under test and the processes it starts put in the temp folder (torchelastic's
    ``torchelastic_*`` run folders, DeepSpeed's and Triton's scratch) lands under pytest's basetemp, which pytest
    prunes, not in /tmp, where every run of the suite left its own."""
    import tempfile

    tmp = tmp_path_factory.mktemp("tmpdir", numbered=False)
    before, os.environ["TMPDIR"], tempfile.tempdir = os.environ.get("TMPDIR"), str(tmp), None
    yield tmp
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None


@pytest.fixture(scope="session")
def fast() -> tuple[str, ...]:
    """The flags of the tiny run (tests/tiny_run.py): ``yx("train", *fast, "--max_steps", "4")``."""
    return FAST


@pytest.fixture(scope="session")
def yx():
    """``yx(*args, check=True, **subprocess_kw)``: the real CLI in a subprocess (tests/tiny_run.py)."""
    return run_cli
