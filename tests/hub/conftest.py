"""Fixtures: a prepared dataset and a checkpointed run that uses it (tests/hub/helpers.py)."""

from hub.helpers import prepared, tok_run  # noqa: F401
