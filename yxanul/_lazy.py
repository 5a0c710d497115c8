"""PEP 562 lazy package exports: ``yxanul.config`` needs each component's ``*Args`` dataclass to
parse flags, and importing a package must not pull torch/transformers in for that (``yxanul train
--help`` and one-line config errors stay well under a second)."""

from __future__ import annotations

from importlib import import_module


def lazy_exports(package: str, where: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package`` whose public name ``n`` lives in ``package.where[n]``."""

    def __getattr__(name: str):
        if name in where:
            return getattr(import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(where)

    return __getattr__, __dir__
