"""The sources of a run: `dataset` or the entries of a `datasets` mixture resolved to :class:`Source` s, and
what would read a document twice refused: one path listed twice, or two entries reaching one file."""

from __future__ import annotations

import os

from ..errors import DataError
from .sources import BUNDLED_CORPUS, Source, resolve_source
from .template import unescape

SETTINGS = ("name", "split", "text_column", "text_template")  # what tells two readings of one file apart


def resolve_sources(args) -> list[Source]:
    if args.datasets:
        out = [resolve_source(d["path"], float(d.get("weight", 1.0)), d.get("split", args.dataset_split),
                              d.get("text_column", args.text_column), d.get("name")) for d in args.datasets]
        for src, d in zip(out, args.datasets):
            # the top-level text_template is, like text_column, the default of an entry that sets neither
            top = None if "text_column" in d else getattr(args, "text_template", None)
            src.max_tokens, src.text_template = d.get("max_tokens"), unescape(d.get("text_template", top))
            src.max_epochs = int(d.get("max_epochs", 1))
        _label_repeated_paths(out)
        _refuse_shared_files(out)
        return out
    if args.dataset:
        src = resolve_source(args.dataset, 1.0, args.dataset_split, args.text_column, args.dataset_name)
        src.text_template = unescape(getattr(args, "text_template", None))
        return [src]
    return [resolve_source(str(BUNDLED_CORPUS))]


def _label_repeated_paths(sources: list[Source]) -> None:
    """A path listed twice in a mixture (two configs or splits of one Hub dataset) is named by what tells the
    entries apart; twice with the same settings is one line (its documents would be read twice, and the report
    would merge the two)."""
    for src in sources:
        same = [s for s in sources if s.path == src.path]
        if len(same) == 1:
            continue
        parts = [f"{k}={getattr(src, k)}" for k in SETTINGS if len({getattr(s, k) for s in same}) > 1]
        if not parts:
            raise DataError(f"dataset '{src.path}': listed {len(same)} times in datasets with the same settings "
                            "(its documents would be read twice); list it once, with the weight of all, or set "
                            "its max_epochs")
        src.label = f"{src.path} ({', '.join(parts)})"


def _refuse_shared_files(sources: list[Source]) -> None:
    """Two entries spelt differently (``d/a.jsonl`` and ``/abs/d/a.jsonl``, a glob or folder and a file in it, a
    symlink) that read one local file with the same settings: one line naming both and the file. Its documents
    would be read twice, and a copy hashed into validation would also be trained on. The same file with another
    column, template or split (a save_to_disk DatasetDict) is two readings, as for a repeated path."""
    seen: dict[tuple, dict[str, Source]] = {}
    for src in sources:
        if src.files is None:  # a Hub name: compared by name, above
            continue
        owners = seen.setdefault(tuple(getattr(src, k) for k in SETTINGS), {})
        for f in src.files:
            real = os.path.realpath(f)
            other = owners.setdefault(real, src)
            if other is not src:
                raise DataError(f"datasets: entries '{other.path}' and '{src.path}' both read '{real}' with the "
                                "same settings (its documents would be read twice, and leak from validation into "
                                "training); list each file in one entry only (its max_epochs reads it more than once)")
