"""`yxanul push MODEL --hub_model_id ORG/NAME` (the training-time pusher: background.py).

Uploads go through ``huggingface_hub.HfApi`` (``create_repo``, ``create_branch``, ``upload_folder``: one
commit per push, no git subprocess). The token is never an argument here: HfApi reads ``HF_TOKEN`` or the
``hf auth login`` file itself, so it cannot leak into console lines, logs, configs, metrics,
checkpoints or the card. Tests pass a stand-in ``api`` that records what the real client would send.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, UserError, first_line
from ..flags import check_same_as, parse_command, same_as
from .args import HubArgs, check_repo_id

log = logging.getLogger(__name__)


LATER = "drop --push_to_hub and push later with `yxanul push RUN --hub_model_id ORG/NAME`"


def default_api(command: bool = False):
    """The real client, refused in one line when the environment says the Hub is off-limits or no token is
    found: HfApi would find out at the first upload, which in training comes after the first checkpoint.
    ``command``: for `yxanul push` (its advice), else for ``--push_to_hub``."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        then = "unset it (HF_HUB_OFFLINE=0) for this command" if command else f"unset it, or {LATER}"
        raise UserError(f"push to the Hub: HF_HUB_OFFLINE is set, so nothing can be pushed; {then}")
    from huggingface_hub import HfApi, get_token

    try:
        token = get_token()  # HF_TOKEN, the `hf auth login` file, or an OIDC exchange (which raises when it fails)
    except Exception as e:  # noqa: BLE001 - one line, whatever the login method
        raise UserError(f"push to the Hub: no usable token ({type(e).__name__}: {first_line(e)})") from None
    if token is None:
        login = "set HF_TOKEN or run `hf auth login` first"
        raise UserError(f"push to the Hub: no Hugging Face token found; {login}" + ("" if command else f", or {LATER}"))
    return HfApi()  # it reads the token itself: never an argument here


def refused_by_hub(e: BaseException) -> int | None:
    """The HTTP status of a Hub answer that retrying will not change (401: the token is not valid or may not
    create repositories; 403: no write access to the namespace), else None."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    return status if status in (401, 403) else None


WEIGHT_FILES = ["model*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
                "pytorch_model.bin.index.json"]


def open_repo(api, repo_id: str, *, private: bool = False, revision: str | None = None) -> None:
    """Create the repository (and branch) if missing; an existing one is left as it is."""
    api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
    if revision:
        api.create_branch(repo_id=repo_id, branch=revision, repo_type="model", exist_ok=True)


def upload(api, folder: Path, repo_id: str, *, private: bool = False, revision: str | None = None,
           commit_message: str = "Upload model") -> str:
    """Create the repo (and branch) if needed and upload ``folder`` as one commit; returns the commit URL."""
    open_repo(api, repo_id, private=private, revision=revision)
    # an earlier push's weights that this folder does not have (one file then, shards now, or the reverse) would
    # stay beside the new ones, and transformers loads the single file first: the same commit deletes them
    info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model", revision=revision,
                             commit_message=commit_message, ignore_patterns=[".*", "__pycache__/*"],
                             delete_patterns=WEIGHT_FILES)
    return str(getattr(info, "commit_url", info))


def push(model: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
         commit_message: str | None = None, license: str = "other", api=None) -> str:
    """Push an export folder as it is, or a run/checkpoint exported (Llama, bf16, with card) to a temp folder."""
    from .export import export  # torch: --help stays light
    from .loading import is_export  # torch: --help stays light

    check_repo_id("hub_model_id", repo_id)
    api = api or default_api(command=True)
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


@dataclass
class PushCommand:
    """Push a run (its best, else latest checkpoint, exported as Llama with a model card) or an export folder
    to the Hugging Face Hub. The token comes from HF_TOKEN or `hf auth login`."""

    model: str = field(metadata={"positional": True, "help": "Run directory, checkpoint folder or export folder."})
    hub_model_id: str | None = same_as(HubArgs, "hub_model_id")  # required here
    private: bool = field(default=False, metadata={"help": "Create the repository as private."})
    revision: str | None = field(default=None, metadata={"help": "Branch to push to (created if missing)."})
    commit_message: str | None = field(default=None, metadata={"help": "Commit message."})
    license: str = field(default="other", metadata={"help": "License in the card's metadata (run sources)."})

    def __post_init__(self):
        if not self.hub_model_id:
            raise ConfigError("hub_model_id", "ORG/NAME (`yxanul push MODEL --hub_model_id ORG/NAME`)")
        check_same_as(self)


def main(argv: list[str] | None = None, api=None) -> int:
    a = parse_command(PushCommand, argv, prog="yxanul push")
    try:
        url = push(a.model, a.hub_model_id, private=a.private, revision=a.revision,
                   commit_message=a.commit_message, license=a.license, api=api)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - Hub/network/auth errors: one line, exit code 2, no traceback
        raise UserError(f"push to '{a.hub_model_id}' failed: {type(e).__name__}: {first_line(e)} (logged in? "
                        "HF_TOKEN or `hf auth login`; network reachable?)") from None
    print(f"pushed {a.model} to {a.hub_model_id}: {url}")
    return 0

