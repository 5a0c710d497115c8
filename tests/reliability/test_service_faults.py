"""An unreachable service never stops or stalls training: Hub pushes run beside it (a queue of one waiting
export, the newest wins, staged exports pruned, one warning per outage, a bounded wait at the end), an
offline setup is refused before step 1, and a W&B server that cannot be reached means offline logging
with one warning. The Hub is a stand-in that records what the real client would send (tests/hub)."""

import threading
import time

import pytest
from _reliability import ok, one_line, yx_here
from hub.helpers import RecordingHfApi, no_token
from tiny_run import FAST

PUSH = ["--push_to_hub", "--hub_model_id", "me/run", "--hub_wait_s", "1"]


def _train(out, *more, steps=12):
    return yx_here("train", *FAST, "--max_steps", steps, "--checkpoint_freq", "2", "--keep_last", "2",
                   "--output_dir", out, *more)


def _staged(out):
    return sorted(p.name for p in (out / "hub").iterdir()) if (out / "hub").is_dir() else []


def test_a_hub_that_hangs_never_holds_training_up(tmp_path, monkeypatch):
    """Measured on the loaded 2-core box (load ~18): 12 steps took 13.4 s / 12.2 s without pushes and 20.1 s
    with uploads that each block 30 s (the difference: 6 exports and the 1 s final wait)."""
    gate = threading.Event()  # every upload hangs until the test ends
    api = RecordingHfApi(gate=gate)
    monkeypatch.setattr("yxanul.hub.push.default_api", lambda: api)
    try:
        t0 = time.monotonic()
        r = ok(_train(tmp_path / "r", *PUSH))
        took = time.monotonic() - t0
        assert not gate.is_set() and api.max_active == 1 and api.uploads() == []  # still on step_2's upload
        assert took < 120, took  # 6 saves; waiting for each upload would take 5 x 30 s at least
        assert "the push of step_12 did not finish in 1 s" in r.stdout
        assert _staged(tmp_path / "r") == ["step_12", "step_2"]  # in flight + the newest; 4 to 10 superseded
    finally:
        gate.set()


def test_an_outage_is_one_warning_and_staged_exports_are_pruned(tmp_path, monkeypatch):
    api = RecordingHfApi(fail=10**6)
    monkeypatch.setattr("yxanul.hub.push.default_api", lambda: api)
    r = ok(_train(tmp_path / "r", *PUSH))
    assert r.stdout.count("warning: push to me/run failed") == 1, r.stdout
    assert len(_staged(tmp_path / "r")) <= 3  # keep_last 2 failed + the one still trying
    assert "step_12" in _staged(tmp_path / "r")  # the newest export is never the one deleted


def test_push_to_hub_with_the_hub_offline_is_refused_before_step_1(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = _train(tmp_path / "r", *PUSH)
    one_line(r, 2, "push to the Hub: HF_HUB_OFFLINE is set, so nothing can be pushed")
    assert "step    1" not in r.stdout and not (tmp_path / "r").exists()


def test_push_to_hub_without_a_token_or_with_one_the_hub_refuses_stops_before_step_1(tmp_path, monkeypatch):
    """Neither waits for the first checkpoint's push to find out: no token is one line (huggingface_hub's own
    lookup), and a repository the token may not create or write is refused by the Hub at train begin."""
    with pytest.MonkeyPatch.context() as mp:
        no_token(mp, tmp_path)
        r = _train(tmp_path / "a", *PUSH)
    one_line(r, 2, "push to the Hub: no Hugging Face token found; set HF_TOKEN or run `hf auth login` first, or "
                   "drop --push_to_hub")
    assert "step    1" not in r.stdout and not (tmp_path / "a").exists()  # refused before the run directory
    monkeypatch.setattr("yxanul.hub.push.default_api", lambda: RecordingHfApi(refuse=403))
    r = _train(tmp_path / "b", *PUSH)
    one_line(r, 2, "push to the Hub: me/run cannot be created or written with this token (HTTP 403")
    assert "step    1" not in r.stdout and not (tmp_path / "b").exists()


def test_an_unreachable_wandb_server_means_offline_logging_and_one_warning(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)  # a well-formed key, for a server that is not there
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")  # refused at once: the wait is all timeout
    out = tmp_path / "r"
    r = ok(_train(out, "--use_wandb", steps=2))
    assert r.stdout.count("warning: W&B could not start online") == 1, r.stdout
    assert list((out / "wandb").glob("offline-run-*")) and (out / "checkpoints" / "step_2").is_dir()


def test_wandb_failing_in_offline_mode_is_not_retried_as_if_it_had_been_online(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "r"
    out.mkdir()
    (out / "wandb").write_text("a file where W&B writes its folder")
    r = ok(_train(out, "--use_wandb", steps=2))
    assert "could not start online" not in r.stdout, r.stdout
    assert r.stdout.count("warning: W&B could not start even offline") == 1, r.stdout
    assert (out / "checkpoints" / "step_2").is_dir()


@pytest.fixture(autouse=True)
def _no_wandb_left():
    yield
    import wandb

    wandb.teardown()
