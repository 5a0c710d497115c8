"""Fixtures shared with tests/evaluation: a prepared dataset and a checkpointed run that uses it."""

from tests.evaluation.conftest import prepared, tok_run  # noqa: F401
