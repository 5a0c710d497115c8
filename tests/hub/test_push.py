"""`yxanul push` and HubPushCallback against a stand-in HfApi that records what the real client would send
(the Hub is unreachable here). The token (HF_TOKEN) never shows up in output or any written file."""

import logging
import threading
import time
from pathlib import Path

import pytest

from hub.helpers import SECRET, RecordingHfApi, no_token, random_model, save_run
from yxanul.cli import main as cli
from yxanul.hub.args import HubArgs
from yxanul.hub.background import HubPushCallback
from yxanul.hub.push import main as push_main


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    model = random_model(2, True, 1024)
    save_run(model, tmp_path / "run", te_views=False, step=2)
    (tmp_path / "run" / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 7.0, "tokens_per_sec": 1000.0}\n{"step": 2, "loss": 6.5, "tokens_per_sec": 1200.0}\n'
        '{"step": 2, "val_loss": 6.6, "val_ppl": 735.1}\n')
    return tmp_path / "run"


def no_secret_anywhere(root: Path, *texts: str) -> None:
    for t in texts:
        assert SECRET not in t
    for p in root.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


def test_push_run_uploads_llama_export_with_card(run, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    api = RecordingHfApi()
    assert push_main([str(run), "--hub_model_id", "me/tiny-shakespeare", "--private", "--revision", "exp1"],
                     api=api) == 0
    assert api.calls[0] == ("create_repo", dict(repo_id="me/tiny-shakespeare", private=True, exist_ok=True))
    assert api.calls[1] == ("create_branch", dict(repo_id="me/tiny-shakespeare", branch="exp1"))
    (up,) = api.uploads()
    assert up["revision"] == "exp1" and up["message"] == "Upload model (step 2)"
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md", "trainer_state.json",
            "config.yaml", "metrics.jsonl", "loss_curve.png"} <= set(up["files"])
    card = up["files"]["README.md"].decode()
    assert card.startswith("---\n") and "library_name: transformers" in card and "license: other" in card
    from yxanul.hub.loading import load_checkpoint_model, resolve_checkpoint
    from yxanul.models.configuration_yxanul import count_parameters

    n = count_parameters(load_checkpoint_model(resolve_checkpoint(run)).config)
    assert f"{n:,} parameters" in card and "tokens seen: 200" in card
    assert "validation loss of this checkpoint: 5.0000" in card and "![loss curve](loss_curve.png)" in card
    assert up["files"]["loss_curve.png"][:4] == b"\x89PNG"
    out = capsys.readouterr()
    no_secret_anywhere(run, out.out, out.err, caplog.text,
                       *(c.decode(errors="ignore") for c in up["files"].values()))


def test_a_later_push_in_shards_replaces_the_single_weights_file(run, tmp_path):
    """The Hub keeps a repo's files across commits: an earlier push's model.safetensors beside a later push's
    shards would be what transformers loads (it prefers the single file). The later commit deletes it."""
    from yxanul.hub.export import export

    api = RecordingHfApi()
    assert push_main([str(run), "--hub_model_id", "me/m"], api=api) == 0
    sharded = export(str(run), tmp_path / "sharded", max_shard_size="200KB")
    assert push_main([str(sharded), "--hub_model_id", "me/m"], api=api) == 0
    repo = api.repos[("me/m", None)]
    shards = sorted(p for p in repo if p.startswith("model-"))
    assert "model.safetensors" not in repo and len(shards) > 1 and "model.safetensors.index.json" in repo
    assert "README.md" in repo and "loss_curve.png" in repo  # the rest of the card stays
    # and back to one file: the shards and their index go in the same commit; the user's message is the commit's
    assert push_main([str(run), "--hub_model_id", "me/m", "--commit_message", "back to one file"], api=api) == 0
    repo = api.repos[("me/m", None)]
    assert "model.safetensors" in repo and not [p for p in repo if p.startswith("model-") or p.endswith(".json")
                                                and "index" in p]
    assert api.uploads()[-1]["message"] == "back to one file"


def test_push_errors_are_one_line(run, capsys, tmp_path):
    assert cli(["push", str(run)]) == 2                                   # no --hub_model_id
    assert cli(["push", str(run), "--hub_model_id", "not a repo"]) == 2
    from yxanul.cli import run as run_cmd  # what `yxanul push` does with main's UserError

    assert run_cmd(lambda argv: push_main(argv, api=RecordingHfApi(fail=1)), [str(run), "--hub_model_id", "me/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("error: ") for e in err), err
    assert "Hub unreachable" in err[2] and SECRET not in "".join(err)
    with pytest.MonkeyPatch.context() as mp:  # the push command's own advice, not the training flag's
        mp.setenv("HF_HUB_OFFLINE", "1")
        assert cli(["push", str(run), "--hub_model_id", "me/x"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "HF_HUB_OFFLINE is set" in line and "--push_to_hub" not in line, line
    with pytest.MonkeyPatch.context() as mp:  # no token at all: one line before the export, the command's advice
        no_token(mp, tmp_path)
        assert cli(["push", str(run), "--hub_model_id", "me/x"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "no Hugging Face token found; set HF_TOKEN or run `hf auth login` first" in line, line
    assert "--push_to_hub" not in line and not (run / "hub").exists()


def test_callback_pushes_in_background_never_waits_and_the_newest_export_wins(run, capsys):
    hub = HubArgs(push_to_hub=True, hub_model_id="me/run", hub_strategy="every_save")
    gate = threading.Event()
    api = RecordingHfApi(fail=1, gate=gate)
    cb = HubPushCallback(hub, run, api=api, say=print, retries=2, backoff_s=60)
    cb.on_save(None, run / "checkpoints" / "step_2", is_best=True)
    assert cb._thread is not None and cb._thread.is_alive()  # on_save returned while the upload hangs
    for step in (4, 6):  # saves while the Hub hangs: each returns at once, the newer export replaces the waiting one
        save_run(random_model(2, True, 1024, seed=step), run, te_views=False, step=step)
        t0 = time.monotonic()
        cb.on_save(None, run / "checkpoints" / f"step_{step}", False)
        assert time.monotonic() - t0 < 30
    assert not (run / "hub" / "step_4").exists() and (run / "hub" / "step_6" / "README.md").is_file()
    gate.set()  # step_2's first attempt fails; its 60 s backoff is cut short by the waiting step_6
    t0 = time.monotonic()
    assert cb.wait(timeout=120)
    assert time.monotonic() - t0 < 60 and api.max_active == 1
    assert [u["message"] for u in api.uploads()] == ["Training in progress, step 6"]
    assert cb.failed == [] and not any((run / "hub").iterdir())  # staged folders cleaned after success
    out = capsys.readouterr().out
    assert out.count("warning: push to me/run failed") == 1 and "attempt 1/2" in out and "pushed step_6" in out
    assert "works again" in out
    no_secret_anywhere(run, out)


def test_an_export_handed_over_while_the_upload_thread_ends_is_uploaded(run):
    """The worker found nothing queued and returns, but its thread still lives (preempted before it ends): the
    next save's export must get a worker, not wait for a thread that will never take it."""
    api = RecordingHfApi()
    cb = HubPushCallback(HubArgs(push_to_hub=True, hub_model_id="me/run", hub_strategy="every_save"), run, api=api,
                         say=lambda *a, **k: None)
    ended, real = threading.Event(), cb._worker

    def lingering():
        real()
        ended.set()
        time.sleep(1.0)  # alive, with nothing left to do
    cb._worker = lingering
    cb.on_save(None, run / "checkpoints" / "step_2", is_best=True)
    assert ended.wait(60)
    save_run(random_model(2, True, 1024, seed=4), run, te_views=False, step=4)
    cb.on_save(None, run / "checkpoints" / "step_4", False)
    assert cb.wait(timeout=30)
    assert [u["message"] for u in api.uploads()] == ["Training in progress, step 2", "Training in progress, step 4"]


def test_callback_strategies_and_a_push_that_never_succeeds(run, capsys):
    ckpt = run / "checkpoints" / "step_2"
    best = HubPushCallback(HubArgs(hub_model_id="me/r", hub_strategy="best"), run, api=RecordingHfApi())
    best.on_save(None, ckpt, is_best=False)
    best.on_train_end()
    assert best.api.uploads() == []
    (run / "checkpoints" / "best").unlink()
    best.on_save(None, ckpt)  # no best pointer: not the best
    best.on_train_end()
    assert best.api.uploads() == []
    (run / "checkpoints" / "best").write_text("step_2\n")  # what save_checkpoint writes for a new best
    best.on_save(None, ckpt)
    best.on_train_end()
    assert len(best.api.uploads()) == 1
    end = HubPushCallback(HubArgs(hub_model_id="me/r", hub_strategy="end", hub_private=True), run,
                          api=RecordingHfApi())
    end.on_save(None, ckpt, is_best=True)
    assert end.api.calls == []
    end.on_train_end()
    assert [u["message"] for u in end.api.uploads()] == ["End of training, step 2"]
    down = HubPushCallback(HubArgs(hub_model_id="me/r"), run, api=RecordingHfApi(fail=99), retries=2, backoff_s=0)
    down.on_save(None, ckpt)
    down.on_train_end()  # no exception into the training loop
    assert down.failed == [run / "hub" / "step_2"] and (run / "hub" / "step_2" / "model.safetensors").is_file()
    assert "was not pushed; it stays on disk" in capsys.readouterr().out
    assert down.api.fail == 99 - 2  # exactly `retries` attempts
    flaky = HubPushCallback(HubArgs(hub_model_id="me/r"), run, api=RecordingHfApi(fail=2), retries=3, backoff_s=0)
    flaky.on_save(None, ckpt)
    flaky.on_train_end()
    assert flaky.failed == [] and len(flaky.api.uploads()) == 1  # the third attempt goes through


def test_the_repository_is_opened_before_step_1_and_a_hub_that_fails_or_hangs_is_one_warning(run, capsys):
    """on_train_begin creates the repository as transformers' Trainer does (a token that may not write there
    is refused by the Hub now, not after the first checkpoint); an unreachable or silent Hub costs training at
    most ``open_s`` and one warning, and the first push that goes through says so."""
    from yxanul.errors import UserError

    hub = HubArgs(push_to_hub=True, hub_model_id="me/run", hub_revision="exp1", hub_private=True)
    opened = HubPushCallback(hub, run, api=RecordingHfApi())
    opened.on_train_begin(None)
    assert opened.api.calls == [("create_repo", dict(repo_id="me/run", private=True, exist_ok=True)),
                                ("create_branch", dict(repo_id="me/run", branch="exp1"))]
    with pytest.raises(UserError, match=r"me/run cannot be created or written with this token \(HTTP 403: 403 "
                                        r"Client Error: You don't have the rights .*\); use a token with write"):
        HubPushCallback(hub, run, api=RecordingHfApi(refuse=403)).on_train_begin(None)
    down = HubPushCallback(hub, run, api=RecordingHfApi(create_fail=True), say=print)
    down.on_train_begin(None)  # no exception: training goes on
    assert capsys.readouterr().out.count("warning: push to me/run: the Hub did not open the repository") == 1
    gate = threading.Event()
    silent = HubPushCallback(hub, run, api=RecordingHfApi(create_gate=gate), say=print, open_s=0.5)
    t0 = time.monotonic()
    silent.on_train_begin(None)
    assert time.monotonic() - t0 < 10
    assert "(TimeoutError: no answer in 0.5 s); training goes on, each save retries" in capsys.readouterr().out
    gate.set()  # the Hub answers again: the first save's push goes through, and that is said
    silent.on_save(None, run / "checkpoints" / "step_2", is_best=True)
    assert silent.wait(timeout=60) and len(silent.api.uploads()) == 1
    out = capsys.readouterr().out
    assert "push to me/run works again" in out and "failed" not in out


def test_hub_config_keys(tmp_path, monkeypatch):
    from yxanul.config import parse_args
    from yxanul.errors import ConfigError

    cfg = parse_args(["--push_to_hub", "--hub_model_id", "org/name", "--hub_strategy", "best", "--hub_private"])
    assert cfg.hub.push_to_hub and cfg.hub.hub_strategy == "best" and cfg.hub.hub_private
    with pytest.raises(ConfigError, match="hub_model_id"):
        parse_args(["--push_to_hub"])
    with pytest.raises(Exception, match="hub_strategy"):
        parse_args(["--hub_model_id", "a/b", "--hub_strategy", "sometimes"])
    monkeypatch.setenv("HF_TOKEN", SECRET)
    cfg.save(tmp_path / "c.yaml")  # the run's config.yaml: no token key, no token value
    assert SECRET not in (tmp_path / "c.yaml").read_text() and "hub_token" not in cfg.to_flat_dict()


@pytest.mark.slow
def test_yxanul_train_pushes_each_save_and_scores_eval_tasks_from_its_config(tmp_path, monkeypatch):
    """The trainer builds its callbacks from the config (`--push_to_hub`, `--eval_tasks`): every saved
    checkpoint is exported and uploaded in the background, every evaluation scores the bundled cloze task,
    and the token appears nowhere in the run."""
    from yxanul.config import DEFAULT_CONFIG, parse_args
    from yxanul.tracking import read_metrics
    from yxanul.training import train

    api = RecordingHfApi()
    monkeypatch.setattr("yxanul.hub.push.default_api", lambda: api)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    run_dir = tmp_path / "run"
    cfg = parse_args(["--config", DEFAULT_CONFIG, "--max_steps", "4", "--warmup_steps", "1", "--eval_freq", "2",
                      "--checkpoint_freq", "2", "--eval_steps", "1", "--sample_tokens", "0", "--use_tensorboard",
                      "false", "--num_workers", "0", "--seq_length", "32", "--micro_batch_size", "2",
                      "--eval_tasks", "cloze", "--eval_tasks_limit", "8", "--push_to_hub", "--hub_model_id", "me/run",
                      "--hub_strategy", "every_save", "--output_dir", str(run_dir)])
    train(cfg)
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4] and all(0.0 <= r["cloze_acc"] <= 1.0 for r in evals)
    uploads = api.uploads()
    assert [u["message"] for u in uploads] == ["Training in progress, step 2", "Training in progress, step 4"]
    assert all("model.safetensors" in u["files"] and "config.json" in u["files"] for u in uploads)
    for f in run_dir.rglob("*"):
        assert not f.is_file() or SECRET.encode() not in f.read_bytes(), f
