r"""Device results -> docs/bench/ -> docs/benchmarks.md's table, on fixture JSONs that a real CPU `yxanul bench`
run wrote (tests/fixtures/bench/<variant>/bench.json: nano, seq 32, bf16 + fp8-delayed, which a CPU skips):

    yxanul bench --presets nano --seq_lengths 32 --tokens_per_micro 64 --steps 3 --warmup 1 --vocab_size 512 \
        --precisions bf16,fp8-delayed [--master_weights fp32 | --loss_impl chunked] --out tests/fixtures/bench/<v>
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from yxanul.errors import UserError
from yxanul.tools.bench_table import (
    END,
    START,
    VARIANTS,
    gpu_slug,
    junit_line,
    main,
    merge_junit,
    pack,
    render,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "bench"
DOC = f"# Benchmarks\n\nintro\n\n{START}\nold table\n{END}\n\n## after\ntext\n"


def _rows(variant):
    return json.loads((FIXTURES / variant / "bench.json").read_text())["rows"]


def test_gpu_slug_names_the_card():
    assert gpu_slug({"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}) == "h100"
    assert gpu_slug({"device": "cuda", "device_name": "NVIDIA H200"}) == "h200"
    assert gpu_slug({"device": "cuda", "device_name": "NVIDIA GH200 480GB"}) == "gh200"
    assert gpu_slug({"device": "cpu", "device_name": "x86_64"}) == "cpu"


def test_pack_then_commit_then_render_names_each_json(tmp_path):
    """The device side (pack) and this side (commit + render) on the same files: every number of the table is
    in the JSON its column links to, and the doc outside the markers is untouched."""
    out, bench, doc = tmp_path / "out", tmp_path / "docs" / "bench", tmp_path / "docs" / "benchmarks.md"
    archive, table = pack(FIXTURES, out, day="2026-11-27")
    assert archive.name == "speed-2026-11-27-cpu.tar.gz"
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(f"2026-11-27-cpu-{v}.json" for v in
                                                ("default", "master-fp32", "loss-chunked"))
    summary = (out / "summary.md").read_text()
    assert summary.startswith(table) and "Not measured in this call: loss-te, graphs" in summary
    doc.parent.mkdir(parents=True)
    doc.write_text(DOC)
    assert main(["commit", str(out), "--bench_dir", str(bench), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n" + START) and text.endswith(END + "\n\n## after\ntext\n")
    assert "old table" not in text
    header = next(line for line in text.splitlines() if line.startswith("| preset |"))
    for v in ("default", "master-fp32", "loss-chunked"):  # each column names its JSON, which was committed
        assert f"[{v}](bench/2026-11-27-cpu-{v}.json)" in header and (bench / f"2026-11-27-cpu-{v}.json").is_file()
    assert header.index("default") < header.index("master-fp32") < header.index("loss-chunked")  # VARIANTS order
    bf16 = next(line for line in text.splitlines() if line.startswith("| nano | 32 | bf16 |"))
    base, master = _rows("default")[0], _rows("master-fp32")[0]
    assert f"{base['tokens_per_sec']:,.0f}" in bf16 and f"{master['tokens_per_sec']:,.0f}" in bf16
    assert f"**{master['tokens_per_sec'] / base['tokens_per_sec']:.2f}×**" in bf16
    assert "| nano | 32 | fp8-delayed | skipped | skipped | skipped |" in text
    assert "- default nano fp8-delayed: skipped: no CUDA device" in text  # the reason, once per case
    assert main(["render", "--bench_dir", str(bench), "--doc", str(doc)]) == 0 and doc.read_text() == text


def test_junit_merge_and_the_junit_line(tmp_path):
    """Two real pytest runs' junit files (as `first` makes: Trainer tests, then the rest) -> one tests.xml;
    its line counts what passed, failed and was skipped, and names the failure."""
    (tmp_path / "test_a.py").write_text("import pytest\ndef test_ok(): pass\n"
                                        "@pytest.mark.skip(reason='no GPU')\ndef test_gpu(): pass\n")
    (tmp_path / "test_b.py").write_text("def test_ok(): pass\ndef test_broken(): assert 1 == 2\n")
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # a bare pytest: seconds, not the plugins' imports
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"test_{name}.py",
                        f"--junitxml={name}.xml"], cwd=tmp_path, capture_output=True, timeout=120, env=env, check=False)
    merged = merge_junit([tmp_path / "a.xml", tmp_path / "missing.xml", tmp_path / "b.xml"], tmp_path / "t.xml")
    line = junit_line(merged)
    assert line.startswith("GPU tests ([t.xml](bench/t.xml)): 2 passed, 1 failed, 0 errors, 1 skipped")
    assert line.endswith("failed: `test_b::test_broken`")


def test_commit_keeps_tests_and_parity_under_the_archive_tag_and_rejects_strangers(tmp_path):
    out, bench = tmp_path / "out", tmp_path / "bench"
    pack(FIXTURES, out, day="2026-11-27")
    shutil.copyfile(FIXTURES / "default" / "bench.json", out / "profile.json")
    (out / "parity.json").write_text(json.dumps({"model": "medium", "val_step": 250, "val_loss_bf16": 4.4,
                                                 "val_loss_fp8": 4.41, "val_rel_diff": 0.01 / 4.4}))
    for junit, test in (("first-tests.xml", "test_zero1"), ("gpu-tests.xml", "test_other")):  # `tests`' two
        (out / junit).write_text(f'<testsuites><testsuite name="pytest" tests="1"><testcase classname="t" '
                                 f'name="{test}" time="1.0"/></testsuite></testsuites>')
    (tmp_path / "d.md").write_text(DOC)
    assert main(["commit", str(out), "--bench_dir", str(bench), "--doc", str(tmp_path / "d.md")]) == 0
    names = sorted(p.name for p in bench.iterdir())
    assert "2026-11-27-cpu-profile.json" in names and "2026-11-27-cpu-parity.json" in names
    merged = (bench / "2026-11-27-cpu-tests.xml").read_text()
    assert 'name="test_zero1"' in merged and 'name="test_other"' in merged
    assert "Parity ([2026-11-27-cpu-parity.json](bench/2026-11-27-cpu-parity.json)): medium val loss at step 250" \
        in render(bench) and "(+0.23 %)" in render(bench)
    assert "profile" not in VARIANTS and "2026-11-27-cpu-profile.json)" not in render(bench)  # not a column
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(bad / "speed-2026-11-27-h100.tar.gz", "w:gz") as tar:
        tar.add(FIXTURES / "default" / "bench.json", arcname="../evil.json")
    with pytest.raises(UserError, match="unexpected member '../evil.json'"):
        main(["commit", str(bad), "--bench_dir", str(bench)])


def test_user_mistakes_are_one_line(tmp_path):
    with pytest.raises(UserError, match="no <variant>/bench.json"):
        pack(tmp_path, tmp_path / "o")
    with pytest.raises(UserError, match="give --tag"):
        main(["commit", str(tmp_path), "--bench_dir", str(tmp_path / "b")])
    (tmp_path / "d.md").write_text("no markers\n")
    with pytest.raises(UserError, match="expected the two lines"):
        main(["render", "--bench_dir", str(tmp_path), "--doc", str(tmp_path / "d.md")])
    assert "No device speed results are committed yet" in render(tmp_path)


def test_the_device_script_runs_every_variant_of_the_table_in_its_order():
    """gpu_checks.sh's default FIRST_VARIANTS is the table's VARIANTS (the flags come from the table itself)."""
    import re

    script = (Path(__file__).parents[2] / "scripts" / "device" / "gpu_checks.sh").read_text()
    default = re.search(r"local order=([a-z0-9,-]+)\n", script).group(1)
    assert default.split(",") == list(VARIANTS)


def test_a_later_session_of_the_same_day_and_card_never_overwrites_the_first(tmp_path):
    """Two device sessions on one day and card: the second lands under YYYY-MM-DD.2-<gpu> with its own
    junit files merged into one tests.xml; committing the same files again changes nothing; both groups
    render, the later one first."""
    import xml.etree.ElementTree as ET

    bench, first, second = tmp_path / "bench", tmp_path / "first", tmp_path / "second"
    (tmp_path / "d.md").write_text(DOC)
    pack(FIXTURES, first, day="2026-11-27")
    assert main(["commit", str(first), "--bench_dir", str(bench), "--doc", str(tmp_path / "d.md")]) == 0
    before = {p.name: p.read_bytes() for p in bench.iterdir()}
    assert main(["commit", str(first), "--bench_dir", str(bench), "--doc", str(tmp_path / "d.md")]) == 0
    assert {p.name: p.read_bytes() for p in bench.iterdir()} == before  # the same files: the same tag

    pack(FIXTURES, second, day="2026-11-27")
    data = json.loads((FIXTURES / "default" / "bench.json").read_text())
    data["rows"][0]["tokens_per_sec"] *= 2
    with tarfile.open(second / "speed-2026-11-27-cpu.tar.gz", "w:gz") as tar:
        (second / "x.json").write_text(json.dumps(data))
        tar.add(second / "x.json", arcname="2026-11-27-cpu-default.json")
    for name, case in (("gpu-tests.xml", "test_a"), ("gpu-slow-tests.xml", "test_b")):  # pytest's junit shape
        (second / name).write_text(f'<testsuites><testsuite name="pytest" tests="1" failures="0" errors="0" '
                                   f'skipped="0"><testcase classname="t" name="{case}"/></testsuite></testsuites>')
    assert main(["commit", str(second), "--bench_dir", str(bench), "--doc", str(tmp_path / "d.md")]) == 0
    assert {p.name: p.read_bytes() for p in bench.iterdir() if p.name in before} == before
    assert (bench / "2026-11-27.2-cpu-default.json").read_bytes() != before["2026-11-27-cpu-default.json"]
    cases = [c.get("name") for c in ET.parse(bench / "2026-11-27.2-cpu-tests.xml").getroot().iter("testcase")]
    assert sorted(cases) == ["test_a", "test_b"]
    text = render(bench)
    assert text.index("### CPU, 2026-11-27.2") < text.index("### CPU, 2026-11-27:")
    with pytest.raises(UserError, match="commit each device call's folder on its own"):
        main(["commit", str(first), str(second), "--bench_dir", str(bench)])
    assert "GPU tests ([2026-11-27.2-cpu-tests.xml](bench/2026-11-27.2-cpu-tests.xml)): 2 passed" in text


def test_a_later_call_of_the_session_joins_it_and_other_sessions_or_broken_files_are_refused(tmp_path):
    """The parity call after the speed call (committed with --tag) files under the speed call's tag; an archive
    of another day or card is never filed under the first one's tag; a cut-off archive or junit file is one
    line; sessions order by number (.10 after .9)."""
    from yxanul.tools.bench_table import commit, load

    bench, speed, parity, other = (tmp_path / n for n in ("bench", "speed", "parity", "other"))
    pack(FIXTURES, speed, day="2026-11-28")
    commit([speed], bench)
    parity.mkdir()
    (parity / "parity.json").write_text(json.dumps({"model": "medium", "val_step": 250, "val_loss_bf16": 4.4,
                                                    "val_loss_fp8": 4.41, "val_rel_diff": 0.01 / 4.4}))
    assert [p.name for p in commit([parity], bench, tag="2026-11-28-cpu")] == ["2026-11-28-cpu-parity.json"]
    pack(FIXTURES, other, day="2026-11-29")
    with pytest.raises(UserError, match="is 2026-11-29-cpu, not 2026-11-28-cpu: commit each device session"):
        commit([speed, other], tmp_path / "b2")
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "speed-2026-11-28-cpu.tar.gz").write_bytes((speed / "speed-2026-11-28-cpu.tar.gz").read_bytes()[:200])
    with pytest.raises(UserError, match="not a whole archive"):
        commit([cut], tmp_path / "b3")
    (cut / "speed-2026-11-28-cpu.tar.gz").unlink()
    (cut / "gpu-tests.xml").write_text('<testsuites><testsuite name="pytest" tests="1"><testcase cla')
    with pytest.raises(UserError, match="gpu-tests.xml': not a whole junit XML"):
        commit([cut], tmp_path / "b3", tag="2026-11-28-cpu")
    for n in (9, 10):
        shutil.copyfile(bench / "2026-11-28-cpu-default.json", bench / f"2026-11-28.{n}-cpu-default.json")
    assert list(load(bench))[:3] == [("2026-11-28.10", "cpu"), ("2026-11-28.9", "cpu"), ("2026-11-28", "cpu")]
