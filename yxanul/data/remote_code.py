"""Tokenizers that ship their own Python code (``auto_map`` in tokenizer_config.json / config.json).

transformers runs such code only with ``trust_remote_code=True`` and, given None, asks on a terminal.
yxanul always passes ``False`` (never a prompt: jobs and tests have no stdin) unless the user sets
``--trust_remote_code``, and refuses such a tokenizer in one line. A prepared folder never keeps code:
its tokenizer copy is the plain fast tokenizer (tokenizer.json) with ``auto_map`` and ``*.py`` removed,
so training, export and evaluation never import a file that came with the data.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import DataError

CODE_MAPS = ("tokenizer_config.json", "config.json")


def declares_code(name_or_path: str) -> str | None:
    """The file of a local tokenizer folder that asks for its own code (None: none, or not a folder)."""
    folder = Path(name_or_path)
    for f in CODE_MAPS:
        try:
            if "auto_map" in json.loads((folder / f).read_text()):
                return str(folder / f)
        except (OSError, ValueError, TypeError):
            continue
    return None


def refused(name: str, where: str | None = None) -> DataError:
    return DataError(f"tokenizer '{name}': {where or 'its repository'} declares auto_map, i.e. Python code of its "
                     "own that loading it would run; refused (set --trust_remote_code to run it, if you trust it)")


def strip_code(folder: Path) -> None:
    """A saved tokenizer folder without code: no ``*.py``, no ``auto_map``, a plain fast tokenizer class."""
    for py in folder.glob("*.py"):
        py.unlink()
    for f in CODE_MAPS:
        p = folder / f
        try:
            cfg = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if "auto_map" in cfg:
            cfg.pop("auto_map")
            if f == "tokenizer_config.json":
                cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
            p.write_text(json.dumps(cfg, indent=2))
