r"""``text_template``: one document built from several columns, e.g. MedQA's question / options / answer.

A Python format string over the example's fields (``str.format`` syntax: ``{question}``, ``{options[A]}``).
A dict field is written one ``key. value`` per line in its own order (MedQA's options: ``A. ...`` then
``B. ...``; None values left out), a list one item per line, None as nothing; anything else as ``str(value)``::

    text_template: "Question: {question}\nOptions:\n{options}\nAnswer: {answer_idx}. {answer}"

Applied in :func:`yxanul.data.sources.load_source` (local files and Hub datasets, streamed or not), so
preparing and tokenizer training see the rendered text as the source's ``text`` column.
"""

from __future__ import annotations

import re
import string

from ..errors import ConfigError, DataError


class _Readable(string.Formatter):
    def get_field(self, field_name, args, kwargs):
        obj, used = super().get_field(field_name, args, kwargs)
        if callable(obj):  # ``{text.upper}``: a method would render as "<built-in method ...>" in every document
            raise ValueError(f"{{{field_name}}} is a method, not a value (a template reads fields, it calls nothing)")
        return obj, used

    def format_field(self, value, format_spec):
        if not format_spec:
            if value is None:
                return ""
            if isinstance(value, dict):
                # a missing key of a struct column (datasets fills None) is left out
                return "\n".join(f"{k}. {self.format_field(v, '')}" for k, v in value.items() if v is not None)
            if isinstance(value, (list, tuple)):
                return "\n".join(self.format_field(v, "") for v in value)
        return super().format_field(value, format_spec)


_FORMATTER = _Readable()
_ESCAPES = re.compile(r"\\([nt\\])")


def unescape(template: str | None) -> str | None:
    r"""``\n`` -> newline, ``\t`` -> tab, ``\\`` -> one backslash, wherever the template was written: a shell
    passes ``--text_template "Q: {q}\nA: {a}"`` as backslash + n (so does a single-quoted or plain YAML scalar),
    YAML double quotes as a newline; both mean one template. Its constant text never needs a literal backslash-n
    (a column's text is not touched); ``\\n`` writes one."""
    if template is None:
        return None
    return _ESCAPES.sub(lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], template)


def template_fields(template: str, where: str = "text_template") -> list[str]:
    """The top-level fields a template reads (``{options[A]}`` reads ``options``); a malformed template or
    one without fields is a :class:`ConfigError` naming ``where``."""
    if not isinstance(template, str) or not template:
        raise ConfigError(where, "a non-empty format string over the example's columns, e.g. "
                                 "'Question: {question}\\nAnswer: {answer}'", template)
    try:
        names = [f for _, f, _, _ in _FORMATTER.parse(template) if f is not None]
    except ValueError as e:
        raise ConfigError(where, f"a valid format string ({e})", template) from None
    fields = []
    for name in names:
        top = name.split(".", 1)[0].split("[", 1)[0]
        if not top or top.isdigit():
            raise ConfigError(where, "named fields only, e.g. {question} (not {} or {0})", template)
        if top not in fields:
            fields.append(top)
    if not fields:
        raise ConfigError(where, "at least one {column} field (a constant text would repeat one document)", template)
    return fields


def render(template: str, example: dict) -> str:
    """The document text of one example."""
    return _FORMATTER.vformat(template, (), example)


def check_first_example(template: str, example: dict, source: str) -> None:
    """Every field the template reads is a column of ``example`` (the source's first): else one line."""
    missing = [f for f in template_fields(template) if f not in example]
    if missing:
        raise DataError(f"dataset '{source}': text_template field '{missing[0]}' is not a column of its first "
                        f"example (columns: {', '.join(example)})")
    try:
        render(template, example)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
        raise DataError(f"dataset '{source}': text_template cannot be applied to its first example "
                        f"({type(e).__name__}: {e})") from None


def render_batch(batch: dict, indices: list[int], template: str, source: str) -> dict:
    """``datasets`` batched map with indices: columns -> {"text": [...]}. An example the template cannot be
    applied to (a null, a shorter list than an index asks) is one line naming it: only the first is checked
    before the map."""
    cols = list(batch)
    texts = []
    for i, index in enumerate(indices):
        try:
            texts.append(render(template, {c: batch[c][i] for c in cols}))
        except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
            raise DataError(f"dataset '{source}': text_template cannot be applied to its example {index} "
                            f"({type(e).__name__}: {e})") from None
    return {"text": texts}
