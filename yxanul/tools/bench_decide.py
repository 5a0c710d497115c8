"""Which speed variant becomes the default where, from the committed device numbers (prints; changes nothing).

The rule: a variant becomes the default for a preset when, at every precision measured for it there (BF16 and
FP8 delayed), its tokens/s is at least ``--min_speedup`` (1.03) x today's default's in the same bench call
group (same date, GPU, preset, seq and precision), and so is its fastest step's time (a host-bound eager step
jitters by tens of %: a median gain inside that spread is not one), its losses stay finite, and the parity
run (FP8 vs BF16 validation loss, ``medium``), trained with every flag of the variant, puts FP8 at most
``--parity_tolerance`` (0.5 %) above BF16; with some flags missing the verdict is 'pending'. A variant whose own
flags act on FP8 runs only (``speed_defaults.FP8_ONLY``: ``--fp8_attention``) runs its BF16 cases unchanged: there it
must only not be slower than ``2 - min_speedup`` (0.97: noise), its gain is asked of FP8 (a variant without an FP8
case is no default). A variant that is slower
anywhere, or that was not measured, stays a flag with the reason. From the default's own rows it also says where FP8
(delayed) pays: the smallest hidden size from which FP8 is >= min_speedup x BF16 at every measured larger
preset, the measurement ``fp8_min_gemm_dim`` may move to.

    python -m yxanul.tools.bench_decide                       # newest group in docs/bench/
    python -m yxanul.tools.bench_decide --tag T --parity P --write   # and the 'default' verdicts into the table
    python -m yxanul.tools.bench_decide --parity_runs runs/bf16,runs/fp8 --parity_out parity.json   # the device

``--write`` puts, per preset, the fastest variant whose verdict is 'default' (at every seq measured there) into
yxanul/assets/speed_defaults.yaml with its evidence; a preset without one keeps its entry; ``plain`` winning
removes it. A variant's flags are those its rows ran with (``flags``: its own plus the table's at the time).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..checkpoint.io import saved_config
from ..errors import UserError
from ..flags import parse_command
from ..training import speed_defaults
from .bench_table import VARIANTS, load, read_json
from .compare import compare, read_run

MIN_SPEEDUP, PARITY_TOLERANCE = 1.03, 0.005


def parity_from_runs(bf16_dir: str, fp8_dir: str, model: str = "medium", flags: str = "") -> dict:
    """The last common validation loss of two `yxanul train` runs (``yxanul compare``'s reading of them). Its
    ``flags``: the speed flags the FP8 run trained with (its config.yaml: given and speed defaults alike), else
    ``flags``."""
    cfg = saved_config(fp8_dir)
    flags = speed_defaults.flag_string(cfg) if cfg else flags
    res = compare(read_run(bf16_dir), read_run(fp8_dir))
    if "val_rel_diff" not in res:
        raise UserError(f"bench_decide: '{bf16_dir}' and '{fp8_dir}' share no validation step (--eval_freq)")
    return {"model": model, "flags": flags, "val_step": res["val_step"], "val_loss_bf16": res["val_loss_baseline"],
            "val_loss_fp8": res["val_loss"], "val_rel_diff": res["val_rel_diff"],
            "train_rel_diff": res["train_rel_diff"], "window_steps": res["window_steps"]}


PARITY_KEYS = ("model", "val_step", "val_loss_bf16", "val_loss_fp8", "val_rel_diff")


def read_parity(path: Path, model: str) -> dict:
    """A parity JSON (`parity_from_runs`' output) of ``model``, the preset the rule asks: else one line."""
    p = read_json(path)
    missing = [k for k in PARITY_KEYS if k not in p] if isinstance(p, dict) else list(PARITY_KEYS)
    if missing:
        raise UserError(f"bench_decide: '{path}': not a parity result (no {', '.join(missing)})")
    if p["model"] != model:
        raise UserError(f"bench_decide: '{path}': a parity of {p['model']}, the rule asks {model} (--parity_model)")
    return p


def _ok(row: dict | None) -> bool:
    return bool(row) and row.get("status") == "ok" and bool(row.get("finite", True))


def decide(by_variant: dict[str, dict], parity: dict | None, min_speedup: float = MIN_SPEEDUP,
           parity_tolerance: float = PARITY_TOLERANCE) -> list[dict]:
    """One verdict per (variant, preset, seq): 'default', 'flag' or 'pending', with speed-ups and the reason."""
    rows = {v: {(r["preset"], r["seq_length"], r["precision"]): r for r in d.get("rows", [])}
            for v, d in by_variant.items()}
    base = rows.get("default")
    if not base:
        raise UserError("bench_decide: no 'default' variant among the JSONs: nothing to compare against")
    out = []
    for v in (v for v in VARIANTS if v in rows and v != "default"):
        for preset, seq in dict.fromkeys((p, s) for p, s, _ in base):
            speed, why = {}, []
            flags = _flags(rows[v], preset, seq, VARIANTS[v])  # what it ran with: its own and the table's that day
            fp8_only = _fp8_only(flags, _flags(base, preset, seq, ""))
            for (p, s, prec), b in base.items():
                if (p, s) != (preset, seq):
                    continue
                r = rows[v].get((p, s, prec))
                if not _ok(b):  # the variant ran where the default did not (a time limit): its gain is unknown
                    if _ok(r):
                        why.append(f"{prec}: today's default not measured ({b.get('status', 'missing')})")
                    continue  # neither ran (no FP8 on this device): not a precision measured here
                if not _ok(r):
                    why.append(f"{prec} not measured ({(r or {}).get('status', 'missing')})")
                    continue
                x = r["tokens_per_sec"] / b["tokens_per_sec"]  # compared unrounded: 1.0296 is no 3 % gain
                speed[prec] = round(x, 3)
                if fp8_only and prec == "bf16":  # the same BF16 step: only not slower than the noise
                    if x < 2 - min_speedup:
                        why.append(f"bf16 {x:.3f}x < {2 - min_speedup:.2f}x where its flags change nothing")
                    continue
                best = b["step_ms_min"] / r["step_ms_min"] if r.get("step_ms_min") and b.get(
                    "step_ms_min") else None  # the fastest step of each: a gain that is not jitter holds there too
                if x < min_speedup:
                    why.append(f"{prec} {x:.3f}x < {min_speedup:.2f}x")
                elif best is not None and best < min_speedup:
                    why.append(f"{prec} {x:.3f}x, but {best:.3f}x < {min_speedup:.2f}x on the fastest "
                               f"step (the gain is within the steps' spread)")
            if fp8_only and speed and not set(speed) - {"bf16"}:
                why.append("no FP8 case measured: the gain its flags are for is unknown")
            verdict, reason = _verdict(speed, why, parity, parity_tolerance, flags)
            out.append({"variant": v, "preset": preset, "seq_length": seq, "speedup": speed, "flags": flags,
                        "verdict": verdict, "reason": reason, "fp8_vs_bf16": fp8_vs_bf16(rows[v], preset, seq)})
    return out


def _flags(rows: dict, preset: str, seq: int, fallback: str) -> str:
    return next((r["flags"] for (p, s, _), r in rows.items() if (p, s) == (preset, seq) and "flags" in r), fallback)


def _fp8_only(flags: str, base_flags: str) -> bool:
    """Does a variant differ from the default only by flags that act on FP8 runs alone?"""
    try:
        own, base = speed_defaults.parse_flags(flags), speed_defaults.parse_flags(base_flags)
    except UserError:  # flags the table cannot hold (--torch_compile): not FP8-only
        return False
    changed = {k for k, v in own.items() if base.get(k) != v}
    return bool(changed) and changed <= set(speed_defaults.FP8_ONLY)


def fp8_vs_bf16(rows: dict, preset: str, seq: int) -> float | None:
    """A variant's own FP8 (delayed) ÷ BF16 tokens/s at (preset, seq), the smaller of the median's and the fastest
    step's ratio (None: either did not run). The bench runs every layer in FP8 (``--fp8_min_gemm_dim 0``)."""
    f, b = rows.get((preset, seq, "fp8-delayed")), rows.get((preset, seq, "bf16"))
    if not (_ok(f) and _ok(b)):
        return None
    ratio = f["tokens_per_sec"] / b["tokens_per_sec"]
    if f.get("step_ms_min") and b.get("step_ms_min"):
        ratio = min(ratio, b["step_ms_min"] / f["step_ms_min"])
    return round(ratio, 3)


def parity_within(parity: dict, tol: float = PARITY_TOLERANCE) -> bool:
    """FP8's validation loss at most ``tol`` above BF16's (a NaN is not). One-sided: FP8 below BF16 is no harm. Two
    single-seed runs part at the first FP8 step (delayed scaling's first backward runs with scale 1), so how far
    FP8 lands *below* measures the two runs' spread, not FP8's rounding (docs/benchmarks.md, "Parity")."""
    return math.isfinite(parity["val_rel_diff"]) and parity["val_rel_diff"] <= tol


def _verdict(speed: dict, why: list, parity: dict | None, tol: float, flags: str) -> tuple[str, str]:
    if why or not speed:
        return "flag", "; ".join(why) or "not measured"
    gain = ", ".join(f"{k} {x:.2f}x" for k, x in speed.items())
    if parity is None:
        return "pending", f"{gain}; no parity result yet (gpu_checks.sh parity)"
    if not parity_within(parity, tol):
        return "flag", f"{gain}, but FP8 vs BF16 val loss {100 * parity['val_rel_diff']:+.2f} % > {100 * tol:g} %"
    if not set(flags.split()) <= set(parity.get("flags", "").split()):  # parity of another config
        return "pending", (f"{gain}; parity {100 * parity['val_rel_diff']:+.2f} % ran without some of its flags: "
                           f"PARITY_FLAGS='{flags}' gpu_checks.sh parity")
    return "default", f"{gain}; parity {100 * parity['val_rel_diff']:+.2f} % with its flags"


def fp8_threshold(default: dict, min_speedup: float = MIN_SPEEDUP) -> tuple[int | None, list[tuple]]:
    """(smallest hidden size from which FP8 delayed >= min_speedup x BF16 at every measured larger preset, or None;
    [(preset, seq, hidden, FP8 / BF16)])."""
    from ..models.configuration_yxanul import config_from_preset  # transformers: --help stays light

    rows = {(r["preset"], r["seq_length"], r["precision"]): r for r in default.get("rows", [])}
    ratios = []
    for (p, s, prec), r in rows.items():
        b = rows.get((p, s, "bf16"))
        if prec == "fp8-delayed" and _ok(r) and _ok(b):
            hidden = config_from_preset(p, 50257, s).hidden_size
            ratios.append((p, s, hidden, round(r["tokens_per_sec"] / b["tokens_per_sec"], 3)))
    ratios.sort(key=lambda t: t[2])
    threshold = None
    for i, (_, _, hidden, _) in enumerate(ratios):
        if all(x >= min_speedup for *_, x in ratios[i:]):
            threshold = hidden
            break
    return threshold, ratios


TABLE_HEADER = """\
# Speed defaults: per backend and preset, the speed flags that became the default there because the device
# numbers said so (docs/benchmarks.md, "Speed defaults"). Written by
#   python -m yxanul.tools.bench_decide --tag YYYY-MM-DD-<gpu> --parity docs/bench/<tag>-parity.json --write
# from the committed bench JSONs; change it only through that command. A flag the user sets always wins;
# `--speed_defaults false` turns the table off. Backend te only (the torch backend runs the CPU reference).
"""


def table_entries(decisions: list[dict], tag: str, parity: dict | None,
                  min_speedup: float = MIN_SPEEDUP) -> dict[str, dict | None]:
    """preset -> {flags, evidence} of the fastest variant that is 'default' at every seq measured there (None:
    ``plain`` won, no entry), with ``fp8_min_gemm_dim: 0`` where that variant's own FP8 is >= ``min_speedup`` x
    its BF16 at every seq (on the fastest step too). Variants with flags the table cannot hold
    (``--torch_compile``) never enter it."""
    by: dict[tuple[str, str], list[dict]] = {}
    for d in decisions:
        by.setdefault((d["preset"], d["variant"]), []).append(d)
    best: dict[str, tuple[float, dict]] = {}
    for (preset, v), ds in by.items():
        try:
            speed_defaults.parse_flags(VARIANTS[v].replace("--speed_defaults false", ""))
        except UserError:
            continue
        if all(d["verdict"] == "default" for d in ds):
            score = min(x for d in ds for x in d["speedup"].values())
            if preset not in best or score > best[preset][0]:
                best[preset] = (score, ds[0])
    out: dict[str, dict | None] = {}
    for preset, (_, d) in best.items():
        gain = ", ".join(f"{k} {x:.2f}x" for k, x in d["speedup"].items())
        evidence = f"{tag} {d['variant']}: {gain}; parity {100 * parity['val_rel_diff']:+.2f} % with its flags"
        fp8 = [x["fp8_vs_bf16"] for x in by[(preset, d["variant"])]]
        entry = {"flags": d["flags"], "evidence": evidence}
        if all(x is not None and x >= min_speedup for x in fp8):  # FP8 pays on every layer with these flags
            entry = {**entry, "evidence": f"{evidence}; FP8 {min(fp8):.2f}x its BF16", speed_defaults.THRESHOLD: 0}
        out[preset] = None if d["variant"] == "plain" else entry
    return out


def write_table(path: Path, entries: dict[str, dict | None]) -> list[str]:
    """Update the te section of the table at ``path`` with ``entries``; returns one line per change."""
    raw = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    te = dict(raw.get("te") or {})
    lines = []
    for preset, entry in entries.items():
        if entry is None and preset in te:
            lines.append(f"  {preset}: speed defaults removed (plain won)")
            te.pop(preset)
        elif entry is not None and te.get(preset) != entry:
            t = speed_defaults.THRESHOLD
            dim = f" --{t} {entry[t]}" if t in entry else ""
            lines.append(f"  {preset}: {entry['flags']}{dim} ({entry['evidence']})")
            te[preset] = entry
    path.write_text(TABLE_HEADER + yaml.safe_dump({"te": te}, sort_keys=False, width=200))
    speed_defaults.load_table(path)  # what it wrote loads as the trainer reads it
    return lines


def report(decisions: list[dict], threshold: int | None, ratios: list[tuple], parity: dict | None, tag: str) -> str:
    lines = [(f"defaults decision from {tag} (rule: >= {MIN_SPEEDUP:.2f}x at every precision, finite losses, "
              f"FP8 val loss at most {100 * PARITY_TOLERANCE:g} % above BF16):")]
    if parity:
        lines.append(f"  parity ({parity['model']}, flags '{parity.get('flags', '')}'): val loss at step "
                     f"{parity['val_step']} BF16 {parity['val_loss_bf16']:.4f} FP8 {parity['val_loss_fp8']:.4f} "
                     f"({100 * parity['val_rel_diff']:+.2f} %)")
    for d in decisions:
        lines.append(f"  {d['verdict'].upper():<8} {d['variant']:<13} {d['preset']:<10} seq {d['seq_length']}: "
                     f"{d['reason']}")
    for p, s, hidden, x in ratios:
        lines.append(f"  FP8 delayed / BF16, default: {p} (hidden {hidden}) seq {s}: {x:.2f}x")
    lines.append(f"  fp8_min_gemm_dim: {threshold if threshold else 'no change (FP8 wins at no measured size)'}"
                 + (" (FP8 >= the bar from this width up)" if threshold else ""))
    return "\n".join(lines)


@dataclass
class DecideCommand:
    """Print which speed variant becomes the default where (the rule, applied to committed numbers)."""

    bench_dir: str = field(default="docs/bench", metadata={"help": "The committed YYYY-MM-DD-<gpu>-*.json."})
    tag: str | None = field(default=None, metadata={"help": "YYYY-MM-DD-<gpu> (default: the newest)."})
    parity: str | None = field(default=None, metadata={"help": "Parity JSON (default: <tag>-parity.json there)."})
    parity_runs: str | None = field(default=None, metadata={"help": "BF16_RUN,FP8_RUN: compute the parity JSON "
                                                            "from two `yxanul train` runs instead."})
    parity_out: str | None = field(default=None, metadata={"help": "With --parity_runs: write it here."})
    parity_model: str = field(default="medium", metadata={"help": "The parity's preset: what --parity_runs trained, "
                                                          "what --parity must be of."})
    parity_flags: str = field(default="", metadata={"help": "With --parity_runs: the speed flags they trained with "
                                                            "(read from the runs' config.yaml when they have one)."})
    write: bool = field(default=False, metadata={"help": "Write the 'default' verdicts into --table."})
    table: str = field(default=str(speed_defaults.TABLE_FILE), metadata={"help": "The speed-defaults table."})


def main(argv: list[str] | None = None) -> int:
    a = parse_command(DecideCommand, argv, prog="python -m yxanul.tools.bench_decide",
                      description=__doc__.split("\n\n")[0])
    if a.parity_runs:
        runs = a.parity_runs.split(",")
        if len(runs) != 2:
            raise UserError(f"bench_decide: --parity_runs expects BF16_RUN,FP8_RUN (got '{a.parity_runs}')")
        p = parity_from_runs(*runs, model=a.parity_model, flags=a.parity_flags)
        if a.parity_out:
            Path(a.parity_out).write_text(json.dumps(p, indent=2))
        ok = parity_within(p)
        print(f"parity {p['model']}: val loss at step {p['val_step']}: BF16 {p['val_loss_bf16']:.4f}, FP8 "
              f"{p['val_loss_fp8']:.4f} ({100 * p['val_rel_diff']:+.2f} %): "
              f"{'within' if ok else 'OUTSIDE'} {100 * PARITY_TOLERANCE:g} %")
        return 0 if ok else 1
    groups = load(Path(a.bench_dir))
    tag = a.tag or (f"{next(iter(groups))[0]}-{next(iter(groups))[1]}" if groups else None)
    records = {k: v for (day, gpu), recs in groups.items() if f"{day}-{gpu}" == tag for k, v in recs.items()}
    if not records:
        raise UserError(f"bench_decide: no YYYY-MM-DD-<gpu>-<variant>.json for '{tag}' in {a.bench_dir}")
    by_variant = {name[len(tag) + 1:-len(".json")]: data for name, data in records.items()}
    ppath = Path(a.parity) if a.parity else Path(a.bench_dir) / f"{tag}-parity.json"
    if a.parity and not ppath.is_file():
        raise UserError(f"bench_decide: --parity '{a.parity}': no such file")
    parity = read_parity(ppath, a.parity_model) if ppath.is_file() else None
    threshold, ratios = fp8_threshold(by_variant.get("default", {}))
    decisions = decide(by_variant, parity)
    print(report(decisions, threshold, ratios, parity, tag))
    if a.write:
        lines = write_table(Path(a.table), table_entries(decisions, tag, parity) if parity else {})
        print(f"{a.table}: " + ("\n".join(["changed:", *lines]) if lines else "unchanged"))
    return 0


if __name__ == "__main__":
    import sys

    from ..cli import run

    sys.exit(run(main, sys.argv[1:], process_exit=True))
