"""Device speed results -> docs/bench/ -> docs/benchmarks.md's generated speed table.

``python -m yxanul.tools.bench_table pack SRC --out OUT`` (on the device, `gpu_checks.sh first`): SRC holds one
folder per speed variant with the ``bench.json`` that `yxanul bench` wrote; each becomes
``YYYY-MM-DD-<gpu>-<variant>.json`` in one ``speed-YYYY-MM-DD-<gpu>.tar.gz`` (a device call returns at most 8
files), and ``summary.md`` gets the table.

``python -m yxanul.tools.bench_table commit DIR [DIR ...]`` (here, on the folders the device calls returned):
the archive's JSONs, ``tests.xml``, ``parity.json`` and ``profile.json`` go to docs/bench/ under the same
``YYYY-MM-DD-<gpu>-`` prefix, and docs/benchmarks.md's table between its two markers is regenerated from
every committed JSON (``render`` does the last step alone). Each column names the JSON its numbers come from.
"""

from __future__ import annotations

import json
import re
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import UserError
from ..flags import parse_command

# the speed variants of `gpu_checks.sh first`, in the table's column order (name -> yxanul bench flags)
VARIANTS = {
    "default": "",
    "master-fp32": "--master_weights fp32",
    "loss-te": "--loss_impl te",
    "graphs": "--cuda_graphs",
    "stack": "--loss_impl te --fuse_qkv_params --master_weights fp32 --cuda_graphs",
    "stack-no-masters": "--loss_impl te --fuse_qkv_params --cuda_graphs",  # the flags of the 2026-11-26.2 parity
    "stack-rope": "--loss_impl te --fuse_qkv_rope --cuda_graphs",  # stack-no-masters, q/k RoPE in the QKV kernel
    "rope-masters": "--fuse_qkv_rope --master_weights fp32",  # on top of the table's entry: what is left to stack
    "wgrad-masters": "--fuse_qkv_rope --master_weights fp32 --fuse_wgrad_accumulation",  # its grad cast, in the GEMM
    "triton-rope": "--fuse_qkv_rope --rope_kernel triton --master_weights fp32 --fuse_wgrad_accumulation",  # RoPE
    "cudnn-norm": "--norm_kernel cudnn",  # on top of the table: cuDNN's RMSNorm (TE's is general-purpose at 1920)
    # every change aimed at xlarge's FP8 / BF16 ratio, together
    "ratio-stack": "--loss_impl te --fuse_qkv_rope --rope_kernel triton --master_weights fp32 "
                   "--fuse_wgrad_accumulation --fp8_attention --norm_kernel cudnn",
    # triton-rope + cudnn-norm: the two measured on 2026-11-27.4 (ratio-stack failed there: --fp8_attention found no
    # TE attention backend for gpt2-124m's 64-wide heads)
    "rope-norm": "--fuse_qkv_rope --rope_kernel triton --master_weights fp32 --fuse_wgrad_accumulation "
                 "--norm_kernel cudnn",
    # rope-norm + FP8 attention: cuDNN's FP8 attention trains only 128-wide heads below sm_100 (xlarge's, not
    # gpt2-124m's or medium's: those FP8 cases are skipped with the one-line reason)
    "rope-norm-attn": "--fuse_qkv_rope --rope_kernel triton --master_weights fp32 --fuse_wgrad_accumulation "
                      "--norm_kernel cudnn --fp8_attention",
    "fp8-attention": "--fp8_attention",  # on top of the table: the FP8 cases' attention in FP8 too (BF16: unchanged)
    "fused-qkv": "--fuse_qkv_params",
    "fused-rope": "--fuse_qkv_rope",
    "loss-chunked": "--loss_impl chunked",
    "compile": "--torch_compile",
    "plain": "--speed_defaults false",  # none of yxanul/assets/speed_defaults.yaml: what the table's entries beat
}
# YYYY-MM-DD[.N]-<gpu>-<what>: .N numbers a later device session of the same day and card (commit picks it)
NAME = re.compile(r"^(\d{4}-\d{2}-\d{2}(?:\.\d+)?)-([a-z0-9]+)-([a-z0-9-]+)\.(json|xml)$")
TAG = re.compile(r"^\d{4}-\d{2}-\d{2}(?:\.\d+)?-[a-z0-9]+$")
JUNIT_FILES = ("tests.xml", "first-tests.xml", "gpu-tests.xml", "gpu-slow-tests.xml")  # first | tests (2) | slow
START, END = "<!-- bench-table:start (python -m yxanul.tools.bench_table render) -->", "<!-- bench-table:end -->"


def gpu_slug(env: dict) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; a CPU run -> 'cpu' (the file-name part of a device)."""
    if not str(env.get("device", "")).startswith("cuda"):
        return "cpu"
    name = str(env.get("device_name", "gpu")).lower()
    m = re.search(r"\b(gh200|gb200|[abhl]\d{2,3}s?|rtx\s?\d{4})\b", name)
    return re.sub(r"[^a-z0-9]", "", m.group(1) if m else name.replace("nvidia", "")) or "gpu"


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"bench_table: '{path}': not a readable JSON file ({e})") from None


def pack(src: Path, out: Path, day: str | None = None) -> tuple[Path, str]:
    """SRC/<variant>/bench.json -> OUT/speed-<day>-<gpu>.tar.gz and OUT/summary.md; returns (archive, table)."""
    day = day or time.strftime("%Y-%m-%d")
    found = {v: read_json(src / v / "bench.json") for v in VARIANTS if (src / v / "bench.json").is_file()}
    if not found:
        raise UserError(f"bench_table: '{src}': no <variant>/bench.json (variants: {', '.join(VARIANTS)})")
    gpu = gpu_slug(next(iter(found.values()))["env"])
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"speed-{day}-{gpu}.tar.gz"
    records = {}
    with tarfile.open(archive, "w:gz") as tar:
        for v, data in found.items():
            name = f"{day}-{gpu}-{v}.json"
            tar.add(src / v / "bench.json", arcname=name)
            records[name] = data
    table = render_group(day, gpu, records)
    missing = [v for v in VARIANTS if v not in found]
    note = f"\nNot measured in this call: {', '.join(missing)}.\n" if missing else ""
    (out / "summary.md").write_text(table + note)
    return archive, table


def load(bench_dir: Path) -> dict[tuple[str, str], dict[str, dict]]:
    """The committed bench JSONs of the speed variants, grouped by (date, gpu), newest first."""
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for path in sorted(Path(bench_dir).glob("*.json")):
        m = NAME.match(path.name)
        if m and m.group(3) in VARIANTS:
            groups.setdefault((m.group(1), m.group(2)), {})[path.name] = read_json(path)
    return dict(sorted(groups.items(), key=lambda g: session_order(*g[0]), reverse=True))


def session_order(day: str, gpu: str) -> tuple:
    """'2026-11-26.10' after '.9' (a string sort puts it first); the first session of a day has no '.N'."""
    date, _, n = day.partition(".")
    return date, int(n or 1), gpu


def _cell(row: dict | None, base: dict | None, bf16: dict | None) -> str:
    if row is None:
        return "–"
    if row.get("status") != "ok":
        return str(row.get("status", "?"))
    tps = f"{row['tokens_per_sec']:,.0f}"
    if base is row:  # the default column: tok/s and MFU (and FP8 ÷ BF16)
        mfu = f", {100 * row['mfu_bf16_peak']:.1f} %" if row.get("mfu_bf16_peak") is not None else ""
        vs = (f", {row['tokens_per_sec'] / bf16['tokens_per_sec']:.2f}× BF16"
              if bf16 is not None and bf16 is not row and bf16.get("status") == "ok" else "")
        return f"{tps}{mfu}{vs}"
    if base is None or base.get("status") != "ok":
        return tps
    return f"**{row['tokens_per_sec'] / base['tokens_per_sec']:.2f}×** {tps}"


def _rows_by_case(data: dict) -> dict[tuple, dict]:
    return {(r["preset"], r["seq_length"], r["precision"]): r for r in data.get("rows", [])}


def render_group(day: str, gpu: str, records: dict[str, dict]) -> str:
    """One (date, gpu) table: a row per (preset, seq, precision), a column per variant; header links name the
    JSON of each column."""
    by_variant = {NAME.match(n).group(3): (n, _rows_by_case(d)) for n, d in records.items()}
    order = [v for v in VARIANTS if v in by_variant]
    env = next(iter(records.values())).get("env", {})
    args = next(iter(records.values())).get("args", {})
    cases = [c for c in by_variant[order[0]][1]] if "default" not in by_variant else list(by_variant["default"][1])
    for v in order:
        cases += [c for c in by_variant[v][1] if c not in cases]
    accum = args.get("gradient_accumulation_steps", 1)
    accumulation = f" --gradient_accumulation_steps {accum}" if accum != 1 else ""
    head = (f"### {gpu.upper()}, {day}: tokens/s, and × today's default (same preset, seq, precision)\n\n"
            f"{env.get('device_name')} (driver {env.get('driver')}), torch {env.get('torch')}, TE "
            f"{env.get('transformer_engine')}; `yxanul bench --backend {args.get('backend')} --warmup "
            f"{args.get('warmup')} --steps {args.get('steps')} --tokens_per_micro {args.get('tokens_per_micro')} "
            f"--fp8_min_gemm_dim {args.get('fp8_min_gemm_dim')}{accumulation}` + the column's flags; MFU against the "
            "BF16 peak.\n\n")
    lines = ["| preset | seq | precision | " + " | ".join(
        f"[{v}](bench/{by_variant[v][0]})" + (f" `{VARIANTS[v]}`" if VARIANTS[v] else "") for v in order) + " |",
             "|" + "---|" * (3 + len(order))]
    default = by_variant.get("default", (None, {}))[1]
    for case in cases:
        base, bf16 = default.get(case), default.get((case[0], case[1], "bf16"))
        cells = [_cell(by_variant[v][1].get(case), base, bf16) for v in order]
        lines.append(f"| {case[0]} | {case[1]} | {case[2]} | " + " | ".join(cells) + " |")
    reasons = sorted({f"{v} {c[0]} {c[2]}: {r['status']}: {r.get('reason')}" for v in order
                      for c, r in by_variant[v][1].items() if r.get("status") != "ok"})
    notes = "\n\nNot measured:\n" + "\n".join(f"- {r}" for r in reasons) if reasons else ""
    return head + "\n".join(lines) + notes + "\n"


def _xml_root(path: Path):
    try:
        return ET.parse(path).getroot()
    except ET.ParseError as e:
        raise UserError(f"bench_table: '{path}': not a whole junit XML ({e}): the pytest run was cut off?") from None


def junit_line(path: Path) -> str:
    """'GPU tests (file): N passed, F failed, E errors, S skipped' (+ the failed ones) from a junit XML."""
    root = _xml_root(path)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    bad = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s.iter("testcase")
           if c.find("failure") is not None or c.find("error") is not None]
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    line = (f"GPU tests ([{path.name}](bench/{path.name})): {passed} passed, {n['failures']} failed, "
            f"{n['errors']} errors, {n['skipped']} skipped")
    return line + "".join(f"\n  - failed: `{b}`" for b in bad)


def merge_junit(inputs: list[Path], out: Path) -> Path:
    """Several pytest junit files (one per capped pytest run) -> one, every <testsuite> kept. A run cut off
    before it wrote its file is missing here, and its log says so."""
    root = ET.Element("testsuites")
    for path in inputs:
        if Path(path).is_file():
            got = _xml_root(path)
            root.extend([got] if got.tag == "testsuite" else list(got))
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    return out


def parity_line(path: Path) -> str:
    p = read_json(path)
    return (f"Parity ([{path.name}](bench/{path.name})): {p.get('model')} val loss at step {p.get('val_step')}: "
            f"BF16 {p.get('val_loss_bf16'):.4f}, FP8 {p.get('val_loss_fp8'):.4f} "
            f"({100 * p.get('val_rel_diff'):+.2f} %)")


def render(bench_dir: Path) -> str:
    """Every (date, gpu) group of the committed JSONs: the speed table, its test and parity lines."""
    groups = load(bench_dir)
    if not groups:
        return "No device speed results are committed yet (docs/bench/ has no YYYY-MM-DD-<gpu>-<variant>.json).\n"
    parts = []
    for (day, gpu), records in groups.items():
        extra = [f(p) for suffix, f in (("tests.xml", junit_line), ("parity.json", parity_line))
                 if (p := Path(bench_dir) / f"{day}-{gpu}-{suffix}").is_file()]
        parts.append(render_group(day, gpu, records) + "".join(f"\n{e}\n" for e in extra))
    return "\n".join(parts)


def update_doc(doc: Path, table: str) -> None:
    """Replace what lies between the two markers of ``doc`` (nothing else in it changes)."""
    text = doc.read_text()
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise UserError(f"bench_table: '{doc}': expected the two lines '{START}' and '{END}'")
    head, rest = text.split(START, 1)
    doc.write_text(f"{head}{START}\n{table.rstrip()}\n{END}{rest.split(END, 1)[1]}")


def commit(dirs: list[Path], bench_dir: Path, tag: str | None = None) -> list[Path]:
    """The device calls' files -> docs/bench/: the speed archive's JSONs, then the junit files (merged into
    one tests.xml), parity.json and profile.json under the archive's 'YYYY-MM-DD-<gpu>' (or ``tag``).
    Committed results are never overwritten: a later session of the same day and card is 'YYYY-MM-DD.2-<gpu>'
    (.3, ...). Returns the files written."""
    incoming: dict[str, bytes] = {}  # '<what>.json|xml' -> content
    for archive in (a for d in dirs for a in sorted(Path(d).glob("speed-*.tar.gz"))):
        own = archive.name[len("speed-"):-len(".tar.gz")]
        if tag is not None and own != tag:  # one tag would file another day's (or card's) results as its own
            raise UserError(f"bench_table: '{archive}' is {own}, not {tag}: commit each device session on its own")
        tag = own
        try:
            _unpack(archive, incoming)
        except (tarfile.TarError, EOFError, OSError) as e:  # gzip's truncation is an EOFError
            raise UserError(f"bench_table: '{archive}': not a whole archive ({e}): the device call was cut off?") \
                from None
    if tag is None or not TAG.match(tag):
        raise UserError(f"bench_table: no speed-YYYY-MM-DD-<gpu>.tar.gz in {', '.join(map(str, dirs))}: "
                        f"give --tag YYYY-MM-DD-<gpu> (got {tag!r})")
    for d in dirs:
        for name in ("parity.json", "profile.json"):
            if (Path(d) / name).is_file():
                incoming[name] = (Path(d) / name).read_bytes()
    junit = [Path(d) / n for d in dirs for n in JUNIT_FILES if (Path(d) / n).is_file()]
    if junit:
        with tempfile.TemporaryDirectory() as tmp:
            incoming["tests.xml"] = merge_junit(junit, Path(tmp) / "tests.xml").read_bytes()
    bench_dir.mkdir(parents=True, exist_ok=True)
    tag = free_tag(bench_dir, tag, incoming)
    for what, data in incoming.items():
        (bench_dir / f"{tag}-{what}").write_bytes(data)
    return [bench_dir / f"{tag}-{what}" for what in incoming]


def _unpack(archive: Path, incoming: dict[str, bytes]) -> None:
    """The archive's 'YYYY-MM-DD-<gpu>-<variant>.json' members into ``incoming`` ('<variant>.json' -> bytes)."""
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            m = NAME.match(member.name) if member.isfile() else None
            if m is None:
                raise UserError(f"bench_table: '{archive}': unexpected member '{member.name}'")
            what = f"{m.group(3)}.{m.group(4)}"
            if what in incoming:  # two calls' archives: one tag would hold one of them
                raise UserError(f"bench_table: '{archive}': another folder's archive has {what} too: commit "
                                "each device call's folder on its own")
            incoming[what] = tar.extractfile(member).read()


def free_tag(bench_dir: Path, tag: str, incoming: dict[str, bytes]) -> str:
    """``tag``, or its next 'YYYY-MM-DD.N-<gpu>' when a file of it is committed with other content than
    ``incoming``'s (the same files again, or new ones beside them: the same tag)."""
    day, gpu = tag.rsplit("-", 1)
    day, n = day.split(".")[0], 1
    while True:
        taken = {p.name[len(tag) + 1:]: p for p in bench_dir.glob(f"{tag}-*") if NAME.match(p.name)}
        # a later call of the same session adds its files (parity after speed); only a different copy of a file
        # already committed makes it another session
        if all(taken[w].read_bytes() == b for w, b in incoming.items() if w in taken):
            return tag
        n += 1
        tag = f"{day}.{n}-{gpu}"


@dataclass
class BenchTableCommand:
    """Pack device speed results, commit them to docs/bench/, regenerate docs/benchmarks.md's table."""

    action: Literal["pack", "junit", "commit", "render"] = field(metadata={"positional": True, "help": (
        "pack | junit (on the device) | commit (here) | render (the table only)")})
    paths: list[str] = field(default_factory=list, metadata={"positional": True, "metavar": "PATH", "help": (
        "pack: the folder of <variant>/bench.json; junit: the XML files to merge; commit: the folders the "
        "device calls returned")})
    out: str = field(default=".", metadata={"help": "pack: where the archive and summary.md go; junit: the file."})
    bench_dir: str = field(default="docs/bench", metadata={"help": "The committed raw results."})
    doc: str = field(default="docs/benchmarks.md", metadata={"help": "The page whose marked table is regenerated."})
    tag: str | None = field(default=None, metadata={"help": "commit: YYYY-MM-DD-<gpu> when no speed archive is "
                                                    "among the folders."})

    def __post_init__(self):
        if self.action != "render" and not self.paths:
            raise UserError(f"bench_table {self.action}: give the path(s) to read")
        for p in self.paths if self.action != "junit" else ():
            if not Path(p).is_dir():
                raise UserError(f"bench_table: '{p}' is not a folder")


def main(argv: list[str] | None = None) -> int:
    a = parse_command(BenchTableCommand, argv, prog="python -m yxanul.tools.bench_table",
                      description=__doc__.split("\n\n")[0])
    if a.action == "pack":
        archive, table = pack(Path(a.paths[0]), Path(a.out))
        print(table + f"\nwrote {archive} and {Path(a.out) / 'summary.md'}")
        return 0
    if a.action == "junit":
        print(junit_line(merge_junit([Path(p) for p in a.paths], Path(a.out))))
        return 0
    if a.action == "commit":
        for path in commit([Path(p) for p in a.paths], Path(a.bench_dir), a.tag):
            print(f"wrote {path}")
    update_doc(Path(a.doc), render(Path(a.bench_dir)))
    print(f"regenerated the table in {a.doc} from {a.bench_dir}")
    return 0


if __name__ == "__main__":
    import sys

    from ..cli import run

    sys.exit(run(main, sys.argv[1:], process_exit=True))
