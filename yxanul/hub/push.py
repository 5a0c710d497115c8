"""`yxanul push MODEL --hub_model_id ORG/NAME` and the training-time background pusher.

Uploads go through ``huggingface_hub.HfApi`` (``create_repo``, ``create_branch``, ``upload_folder``: one
commit per push, no git subprocess). The token is never an argument here: HfApi reads ``HF_TOKEN`` or the
``huggingface-cli login`` file itself, so it cannot leak into console lines, logs, configs, metrics,
checkpoints or the card. Tests pass a stand-in ``api`` that records what the real client would send.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, UserError
from .args import check_repo_id

log = logging.getLogger(__name__)


def default_api():
    from huggingface_hub import HfApi

    return HfApi()  # token: HF_TOKEN / `huggingface-cli login`, read by huggingface_hub itself


def upload(api, folder: Path, repo_id: str, *, private: bool = False, revision: str | None = None,
           commit_message: str = "Upload model") -> str:
    """Create the repo (and branch) if needed and upload ``folder`` as one commit; returns the commit URL."""
    api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
    if revision:
        api.create_branch(repo_id=repo_id, branch=revision, repo_type="model", exist_ok=True)
    info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model", revision=revision,
                             commit_message=commit_message, ignore_patterns=[".*", "__pycache__/*"])
    return str(getattr(info, "commit_url", info))


def push(model: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
         commit_message: str | None = None, license: str = "other", api=None) -> str:
    """Push an export folder as it is, or a run/checkpoint exported (Llama, bf16, with card) to a temp folder."""
    from .export import export
    from .loading import is_export

    check_repo_id("hub_model_id", repo_id)
    api = api or default_api()
    if is_export(model):
        return upload(api, Path(model), repo_id, private=private, revision=revision,
                      commit_message=commit_message or "Upload model")
    with tempfile.TemporaryDirectory(prefix="yxanul-push-") as tmp:
        out = export(model, Path(tmp) / "export", license=license, repo_id=repo_id)
        step = _step(out)
        return upload(api, out, repo_id, private=private, revision=revision,
                      commit_message=commit_message or f"Upload model (step {step})")


def _step(folder: Path) -> str:
    import json

    f = folder / "trainer_state.json"
    return str(json.loads(f.read_text()).get("step", "?")) if f.is_file() else "?"


class HubPushCallback:
    """Push the exported model of saved checkpoints during training, in a background thread.

    The trainer calls ``on_save(trainer, ckpt_dir)`` on the main process right after each checkpoint is
    committed (``is_best`` defaults to "the run's best pointer names this checkpoint"), and ``on_train_end(trainer)`` once at the end (it waits for the last upload).
    ``on_save`` exports the checkpoint into ``RUN/hub/step_N`` first (in the caller's thread, so a
    checkpoint that keep_last prunes later is never lost to the upload), then waits for the previous
    upload and starts this one. A failed upload is retried ``retries`` times, then a warning; the staged
    folder stays and ``yxanul push`` can send it later. Nothing here raises into the training loop.
    """

    def __init__(self, hub, run_dir: str | Path | None, api=None, say=print, retries: int = 3,
                 backoff_s: float = 10.0):
        self.hub = hub
        self.run_dir = Path(run_dir) if run_dir is not None else None  # None: the trainer's, at train begin
        self.api, self.say, self.retries, self.backoff_s = api, say, retries, backoff_s
        self._thread: threading.Thread | None = None
        self.pushed: list[str] = []   # commit urls
        self.failed: list[Path] = []  # staged folders whose upload failed

    def on_train_begin(self, trainer) -> None:
        if self.run_dir is None:
            self.run_dir = Path(trainer.run_dir)

    @property
    def staging(self) -> Path:
        return self.run_dir / "hub"

    def on_save(self, trainer, ckpt_dir: str | Path, is_best: bool | None = None) -> None:
        """``is_best`` None: read the run's ``best`` pointer (save_checkpoint has just updated it)."""
        if is_best is None:
            from ..checkpoint import _pointer

            best = _pointer(self.run_dir, "best")
            is_best = best is not None and best.name == Path(ckpt_dir).name
        strategy = self.hub.hub_strategy
        if strategy == "every_save" or (strategy == "best" and is_best):
            self._push(Path(ckpt_dir), "Training in progress")

    def on_train_end(self, trainer=None) -> None:
        if self.hub.hub_strategy == "end":
            from .loading import resolve_checkpoint

            try:
                ckpt = resolve_checkpoint(self.run_dir)
            except UserError as e:
                self.say(f"warning: push to the Hub skipped: {e}")
                return
            self._push(ckpt, "End of training")
        self.wait()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _push(self, ckpt: Path, message: str) -> None:
        from .export import export

        try:
            staged = export(ckpt, self.staging / ckpt.name, overwrite=True, license=self.hub.hub_license,
                            repo_id=self.hub.hub_model_id)
        except Exception as e:  # noqa: BLE001 - an export problem must not stop training
            self.say(f"warning: push to the Hub: export of {ckpt} failed ({type(e).__name__}: {e}); not pushed")
            return
        self.wait()  # one upload at a time, in order
        self._thread = threading.Thread(target=self._upload, args=(staged, f"{message}, step {_step(staged)}"),
                                        name="yxanul-hub-push", daemon=False)
        self._thread.start()

    def _upload(self, staged: Path, message: str) -> None:
        api = self.api or default_api()
        for attempt in range(1, self.retries + 1):
            try:
                url = upload(api, staged, self.hub.hub_model_id, private=self.hub.hub_private,
                             revision=self.hub.hub_revision, commit_message=message)
            except Exception as e:  # noqa: BLE001 - network/Hub errors: warn and retry, never crash training
                self.say(f"warning: push to {self.hub.hub_model_id} failed (attempt {attempt}/{self.retries}): "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                if attempt < self.retries:
                    time.sleep(self.backoff_s * attempt)
                continue
            self.pushed.append(url)
            self.say(f"pushed {staged.name} to {self.hub.hub_model_id}: {message}")
            for old in self.failed:  # older staged folders that failed: superseded by this full upload
                shutil.rmtree(old, ignore_errors=True)
            self.failed = []
            shutil.rmtree(staged, ignore_errors=True)
            return
        self.failed.append(staged)
        self.say(f"warning: {staged} was not pushed; it stays on disk (`yxanul push {staged} --hub_model_id "
                 f"{self.hub.hub_model_id}` sends it), the next push retries with a newer checkpoint")


@dataclass
class PushCommand:
    """Push a run (its best, else latest checkpoint, exported as Llama with a model card) or an export folder
    to the Hugging Face Hub. The token comes from HF_TOKEN or `huggingface-cli login`."""

    model: str = field(metadata={"positional": True, "help": "Run directory, checkpoint folder or export folder."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repository, ORG/NAME (created if "
                                                                   "missing). Required."})
    private: bool = field(default=False, metadata={"help": "Create the repository as private."})
    revision: str | None = field(default=None, metadata={"help": "Branch to push to (created if missing)."})
    commit_message: str | None = field(default=None, metadata={"help": "Commit message."})
    license: str = field(default="other", metadata={"help": "License in the card's metadata (run sources)."})

    def __post_init__(self):
        if not self.hub_model_id:
            raise ConfigError("hub_model_id", "ORG/NAME (`yxanul push MODEL --hub_model_id ORG/NAME`)")
        check_repo_id("hub_model_id", self.hub_model_id)


def main(argv: list[str] | None = None, api=None) -> int:
    from ..flags import parse_command

    a = parse_command(PushCommand, argv, prog="yxanul push")
    try:
        url = push(a.model, a.hub_model_id, private=a.private, revision=a.revision,
                   commit_message=a.commit_message, license=a.license, api=api)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - Hub/network/auth errors: one line, exit code 2, no traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UserError(f"push to '{a.hub_model_id}' failed: {type(e).__name__}: {first} (logged in? "
                        "HF_TOKEN or `huggingface-cli login`; network reachable?)") from None
    print(f"pushed {a.model} to {a.hub_model_id}: {url}")
    return 0
