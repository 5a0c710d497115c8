"""A W&B sweep file (W&B's own format) read, checked against yxanul's config keys, and turned into trials.

The same YAML serves ``wandb sweep FILE`` + ``wandb agent`` (W&B's CLI runs its ``command``) and
``yxanul sweep FILE`` (online: W&B's server proposes the trials; offline: :func:`plan_trials` does).
Keys read: ``name``, ``project``, ``entity``, ``method`` (grid | random | bayes), ``metric``
(``name``, ``goal``), ``parameters`` (flat yxanul config keys: ``value``, ``values`` [+ ``probabilities``],
``distribution`` + ``min``/``max``/``mu``/``sigma``/``q``), ``command`` (where ``--config BASE`` and any
fixed flags, and an ``accelerate launch ...`` prefix, are taken from).

Why not W&B's own local engine (the ``sweeps`` package, what ``wandb.controller(local=True)`` uses):
its last release is from 2022, it imports scikit-learn even for a grid and declares a pydantic-v1
config; grid and random are a few lines here, and ``bayes`` offline runs as random (said at start).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import _fields, load_yaml
from ..errors import ConfigError, UserError
from ..flags import coerce, unknown_key

METHODS = ("grid", "random", "bayes")
# W&B macros in `command`; ${args} marks where the trial's --key=value flags go.
MACROS = ("${env}", "${interpreter}", "${program}", "${args}", "${args_no_hyphens}", "${args_no_boolean_flags}")
DISTRIBUTIONS = ("constant", "categorical", "int_uniform", "uniform", "q_uniform", "log_uniform",
                 "log_uniform_values", "q_log_uniform_values", "inv_log_uniform_values", "normal", "q_normal",
                 "log_normal", "q_log_normal")


@dataclass
class SweepSpec:
    """One sweep file, checked."""

    path: str
    name: str
    method: str
    metric: str
    goal: str  # minimize | maximize
    parameters: dict[str, dict[str, Any]]
    raw: dict[str, Any]  # the YAML as read: what wandb.sweep() gets
    launcher: list[str] = field(default_factory=list)  # e.g. ["accelerate", "launch", "--config_file", X]
    fixed: list[str] = field(default_factory=list)  # flags of `command` after the train entry (--config ...)
    project: str | None = None
    entity: str | None = None

    @property
    def swept(self) -> list[str]:
        """Parameters that take more than one value."""
        return [k for k, p in self.parameters.items() if "value" not in p and p.get("distribution") != "constant"]

    def base_config(self) -> str | None:
        return _flag_value(self.fixed, "config")

    def logged_to(self) -> list[str]:
        """The file's ``project``/``entity`` as the trials' W&B flags (``wandb sync`` uploads each run there)."""
        return [f"--wandb_{k}={v}" for k, v in (("project", self.project), ("entity", self.entity)) if v]


def _flag_value(tokens: list[str], name: str) -> str | None:
    for i, t in enumerate(tokens):
        if t == f"--{name}" and i + 1 < len(tokens):
            return tokens[i + 1]
        if t.startswith(f"--{name}="):
            return t.split("=", 1)[1]
    return None


def _err(path: str, what: str) -> UserError:
    return UserError(f"sweep file '{path}': {what}")


def load_spec(path: str) -> SweepSpec:
    try:
        raw = load_yaml(path)
    except UserError as e:  # the same one-line messages, naming it a sweep file
        raise UserError(str(e).replace("config file", "sweep file", 1)) from None
    method = raw.get("method")
    if method not in METHODS:
        raise _err(path, f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    metric = raw.get("metric") or {"name": "eval/val_loss", "goal": "minimize"}
    if not isinstance(metric, dict) or not isinstance(metric.get("name"), str) \
            or metric.get("goal", "minimize") not in ("minimize", "maximize"):
        raise _err(path, f"metric: expected {{name: eval/val_loss, goal: minimize|maximize}}, got {metric!r}")
    if metric["name"].split("/", 1)[0] not in ("eval", "train") or "/" not in metric["name"]:
        raise _err(path, f"metric.name: expected a metric yxanul logs (eval/val_loss, eval/val_ppl, "
                         f"train/loss, ...), got {metric['name']!r}")
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        raise _err(path, "parameters: expected a mapping of yxanul config keys to {value|values|distribution}")
    keys = _fields()
    for key, p in params.items():
        _check_param(path, key, p, keys)
    launcher, fixed = _split_command(path, raw.get("command"))
    name = str(raw.get("name") or Path(path).stem)
    return SweepSpec(path=path, name=name, method=method, metric=metric["name"], goal=metric.get("goal", "minimize"),
                     parameters=params, raw=raw, launcher=launcher, fixed=fixed,
                     project=raw.get("project"), entity=raw.get("entity"))


def _check_param(path: str, key: str, p: Any, keys: dict) -> None:
    if key not in keys:
        e = unknown_key(key, keys, where="see `yxanul train --help`")
        raise _err(path, f"parameters: {e}")
    if not isinstance(p, dict) or not ({"value", "values", "distribution", "min"} & set(p)):
        raise _err(path, f"parameters.{key}: expected {{value: X}}, {{values: [...]}} or {{distribution: ..., "
                         f"min: ..., max: ...}}, got {p!r}")
    if "parameters" in p:
        raise _err(path, f"parameters.{key}: nested parameters are not used (yxanul's config keys are flat)")
    dist = p.get("distribution")
    if dist is not None and dist not in DISTRIBUTIONS:
        raise _err(path, f"parameters.{key}.distribution: expected one of {', '.join(DISTRIBUTIONS)}, got {dist!r}")
    _check_distribution(path, key, p)
    if "values" in p and not (isinstance(p["values"], list) and p["values"]):
        raise _err(path, f"parameters.{key}.values: expected a non-empty list, got {p['values']!r}")
    probs = p.get("probabilities")
    if probs is not None and not (isinstance(probs, list) and len(probs) == len(p.get("values") or [])
                                  and all(isinstance(x, (int, float)) and x >= 0 for x in probs) and sum(probs) > 0):
        raise _err(path, f"parameters.{key}.probabilities: expected one weight >= 0 per value, got {probs!r}")
    samples = [p["value"]] if "value" in p else p.get("values") or [v for v in (p.get("min"), p.get("max"))
                                                                   if v is not None]
    for v in samples:
        try:
            coerce(key, keys[key][2], v, from_cli=False)
        except ConfigError as e:
            raise _err(path, f"parameters.{key}: {e}") from None


RANGED = ("int_uniform", "uniform", "q_uniform", "log_uniform", "log_uniform_values", "q_log_uniform_values",
          "inv_log_uniform_values")  # drawn between min and max


def _check_distribution(path: str, key: str, p: dict) -> None:
    """A distribution's numbers (made numbers in ``p``: YAML 1.1 reads ``1e-4`` as a string) and their ranges,
    checked before any draw: a sweep file's mistake is one line, not a trial's traceback."""
    if "value" in p or "values" in p:
        return
    for name in ("min", "max", "q", "mu", "sigma"):
        v = p.get(name)
        if v is None or type(v) in (int, float):
            continue
        try:
            if isinstance(v, bool):
                raise ValueError
            p[name] = float(v)
        except (TypeError, ValueError):
            raise _err(path, f"parameters.{key}.{name}: expected a number, got {v!r}") from None
    dist = p.get("distribution")
    if dist is None or dist in RANGED:
        lo, hi = p.get("min"), p.get("max")
        if lo is None or hi is None or lo > hi:
            raise _err(path, f"parameters.{key}: distribution {dist or 'uniform'} needs min <= max, got min {lo!r}, "
                             f"max {hi!r}")
        if dist is not None and dist.endswith("_values") and lo <= 0:
            raise _err(path, f"parameters.{key}: distribution {dist} needs min > 0 (a log scale), got {lo!r}")
    for name in ("q", "sigma"):
        if p.get(name, 1) <= 0:
            raise _err(path, f"parameters.{key}.{name}: expected a number > 0, got {p[name]!r}")


def _split_command(path: str, command: Any) -> tuple[list[str], list[str]]:
    """`command` -> (launcher prefix, fixed flags after the train entry). No command: (`[]`, `[]`)."""
    if command is None:
        return [], []
    if not isinstance(command, list) or not all(isinstance(t, str) for t in command):
        raise _err(path, f"command: expected a list of strings, got {command!r}")
    tokens = [t for t in command if t not in ("${env}", "${interpreter}")]
    for i, t in enumerate(tokens):
        entry = 2 if t == "yxanul" and tokens[i + 1:i + 2] == ["train"] else 1 if t.endswith("train.py") \
            or t == "${program}" else 0
        if entry:
            rest = [x for x in tokens[i + entry:] if x not in MACROS]
            return tokens[:i], rest
    raise _err(path, "command: expected `yxanul train ...` or `... train.py ...` in it")


# --------------------------------------------------------------------------- offline trial planning
def _sample(p: dict[str, Any], rng: random.Random) -> Any:
    """One draw from a W&B parameter spec (the distributions of W&B's sweep docs)."""
    if "value" in p:
        return p["value"]
    if "values" in p:
        return rng.choices(p["values"], weights=p.get("probabilities"))[0]
    dist = p.get("distribution") or ("int_uniform" if all(isinstance(p.get(k), int) for k in ("min", "max"))
                                     else "uniform")
    lo, hi, q = p.get("min"), p.get("max"), p.get("q", 1)
    if dist in ("int_uniform",):
        return rng.randint(int(lo), int(hi))
    if dist == "uniform":
        return rng.uniform(lo, hi)
    if dist == "q_uniform":
        return round(rng.uniform(lo, hi) / q) * q
    if dist == "log_uniform":  # min/max are natural-log exponents
        return math.exp(rng.uniform(lo, hi))
    if dist in ("log_uniform_values", "q_log_uniform_values"):
        v = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        return round(v / q) * q if dist.startswith("q_") else v
    if dist == "inv_log_uniform_values":
        return 1.0 / math.exp(rng.uniform(math.log(1.0 / hi), math.log(1.0 / lo)))
    mu, sigma = p.get("mu", 0.0), p.get("sigma", 1.0)
    if dist in ("normal", "q_normal"):
        v = rng.gauss(mu, sigma)
        return round(v / q) * q if dist.startswith("q_") else v
    if dist in ("log_normal", "q_log_normal"):
        v = rng.lognormvariate(mu, sigma)
        return round(v / q) * q if dist.startswith("q_") else v
    raise UserError(f"distribution {dist!r} needs `values`")


def plan_trials(spec: SweepSpec, count: int | None, seed: int = 0) -> list[dict[str, Any]]:
    """The trials' parameters, in order; the same for the same (file, count, seed), so a restarted
    sweep finds the same trials. ``bayes`` offline is random search over the same space."""
    if spec.method == "grid":
        axes = []
        for key, p in spec.parameters.items():
            if "value" in p:
                axes.append([p["value"]])
            elif "values" in p:
                axes.append(p["values"])
            else:
                raise _err(spec.path, f"parameters.{key}: method grid needs `values` (or `value`), "
                                      f"not a distribution")
        grid = [dict(zip(spec.parameters, combo)) for combo in itertools.product(*axes)]
        return grid[:count] if count else grid
    if not count:
        raise UserError(f"sweep '{spec.name}': method {spec.method} runs until stopped on W&B; offline give --count N")
    rng = random.Random(seed)
    return [{k: _sample(p, rng) for k, p in spec.parameters.items()} for _ in range(count)]


def trial_flags(params: dict[str, Any]) -> list[str]:
    """Parameters as flags, the way W&B's ${args} writes them (``--key=value``); a list as the flag and one word
    per item, as a list flag reads it (``--key=['a']`` would be the one string "['a']"), an empty one as null."""
    out = []
    for k, v in params.items():
        out += ([f"--{k}", *map(str, v)] if v else [f"--{k}=null"]) if isinstance(v, list) else [f"--{k}={v}"]
    return out
