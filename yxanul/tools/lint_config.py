"""`yxanul lint-config`: the linter's command (`yxanul.lint.files.main`) with the train config validated as
`yxanul train --config` validates it. Here, not in lint/: the config's sections import the trainer, which
lints its launch with lint/, so the one check that needs both lives above them."""

from __future__ import annotations

import sys

from ..config import resolve
from ..lint.files import main as lint_main


def validate_train(values: dict, path: str) -> None:
    """What `yxanul train --config PATH` checks of the file's values (`config.resolve`): a ConfigError."""
    resolve(values, source=path)


def main(argv: list[str] | None = None) -> int:
    """`yxanul lint-config FILE... [--train_config FILE] ...` (flags: `yxanul.lint.files.LintCommand`)."""
    return lint_main(argv, validate_train=validate_train)


if __name__ == "__main__":
    sys.exit(main())
