"""Shared pieces of the lint rules: `Problem`, the one truthy helper and dotted-path helpers on config dicts."""

from __future__ import annotations

from dataclasses import dataclass

ERROR, WARNING = "error", "warning"


@dataclass
class Problem:
    file: str
    key: str          # dotted key path, e.g. "zero_optimization.stage"
    severity: str     # "error" (refuses to start / the tool raises) | "warning"
    message: str      # the reason
    fix: str          # what to do

    def line(self) -> str:
        return f"{self.file}: {self.severity}: {self.key}: {self.message} -> fix: {self.fix}"

    __str__ = line

    def said(self) -> str:
        """The line for a caller that prefixes the severity itself (``error: `` / ``warning: ``)."""
        return f"{self.file}: {self.key}: {self.message} -> fix: {self.fix}"


def collector(file: str):
    """(problems, add): `add(key, severity, message, fix)` appends a `Problem` of `file`."""
    found: list[Problem] = []
    return found, lambda key, sev, msg, fix: found.append(Problem(file, key, sev, msg, fix))



def _get(d: dict, path: str):
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _delete(d: dict, path: str) -> None:
    *parents, last = path.split(".")
    for part in parents:
        d = d.get(part) if isinstance(d, dict) else None
    if isinstance(d, dict):
        d.pop(last, None)


def _prune(d: dict) -> None:
    for k in [k for k, v in d.items() if isinstance(v, dict)]:
        _prune(d[k])
        if not d[k]:
            del d[k]


def truthy(v) -> bool:
    """The one truthiness rule of the linters (env vars and config values): True, or a string
    "true"/"1"/"yes"/"on" in any case. "auto" is NOT true here: where accelerate fills "auto" with
    an enabled value (DeepSpeed's bf16.enabled under bf16), the rule says so itself."""
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "on"))


def _walk(d: dict, prefix: str = ""):
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _walk(v, path + ".")
        else:
            yield path, v
