"""`HubArgs`: pushing a run's exported model to the Hugging Face Hub during/after training.

Plain data (no torch import): the config/CLI layer reads it. The token is never a config key: it comes
from the environment (``HF_TOKEN``) or ``hf auth login``, which ``huggingface_hub`` reads itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def check_repo_id(key: str, value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not _REPO_ID.match(value) or len(value) > 96):
        raise ConfigError(key, "a Hub repository id like ORG/NAME", value)


@dataclass
class HubArgs:
    """Hugging Face Hub push."""

    push_to_hub: bool = field(default=False, metadata={
        "help": "Push the exported model (Llama format), trainer_state, config, metrics and a model card to "
                "--hub_model_id in a background thread (token: HF_TOKEN or `hf auth login`)."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repository, ORG/NAME (created if missing)."})
    hub_strategy: Literal["every_save", "best", "end"] = field(default="every_save", metadata={
        "help": "When to push: every checkpoint save, only a save that is the new best by val loss, or "
                "once at the end of training."})
    hub_private: bool = field(default=False, metadata={"help": "Create the Hub repository as private."})
    hub_revision: str | None = field(default=None, metadata={"help": "Branch to push to (created if missing; "
                                                                     "default: main)."})
    hub_license: str = field(default="other", metadata={"help": "License in the model card's metadata "
                                                                "(e.g. apache-2.0, mit, other)."})
    hub_wait_s: float = field(default=600.0, metadata={"help": "At the end of training, wait at most this many "
                                                               "seconds for the last push (what is not pushed "
                                                               "stays in RUN/hub for `yxanul push`)."})

    def __post_init__(self):
        check_repo_id("hub_model_id", self.hub_model_id)
        if self.push_to_hub and not self.hub_model_id:
            raise ConfigError("hub_model_id", "ORG/NAME when push_to_hub is true", None)
        if not isinstance(self.hub_wait_s, (int, float)) or self.hub_wait_s < 0:
            raise ConfigError("hub_wait_s", "a number of seconds >= 0", self.hub_wait_s)
        if self.hub_strategy not in ("every_save", "best", "end"):
            raise ConfigError("hub_strategy", "one of 'every_save', 'best', 'end'", self.hub_strategy)
        if self.hub_revision is not None and (not isinstance(self.hub_revision, str) or not self.hub_revision.strip()
                                              or " " in self.hub_revision):
            raise ConfigError("hub_revision", "a branch name without spaces", self.hub_revision)
