"""`yxanul export` OUT: --overwrite replaces an earlier export only (never a folder of runs or a home directory),
OUT = the current directory, a --max_shard_size below one byte, and an OUT that cannot be written: the CLI in
process on a real (tiny) checkpointed run."""

import shutil
from pathlib import Path

import pytest

from hub.helpers import random_model, save_run
from yxanul.cli import main as cli


@pytest.fixture
def run(tmp_path):
    save_run(random_model(2, True, 1024), tmp_path / "run", te_views=False, step=2)
    return tmp_path / "run"


def _files(folder: Path) -> dict:
    return {f.relative_to(folder): f.read_bytes() for f in folder.rglob("*") if f.is_file()}


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_overwrite_replaces_an_earlier_export_and_nothing_else(run, tmp_path, capsys):
    """A folder holding runs, a home-like folder (dotfiles, subfolders), a flat folder of other files and a folder
    with a config.json on top but subfolders (no HF export) are refused with --overwrite, every file intact; an
    earlier export is replaced whole (the shards of a sharded one do not linger)."""
    shutil.copytree(run, tmp_path / "runs" / "a")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id").write_text("key")
    (home / "notes.txt").write_text("notes")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "data.csv").write_text("1,2")
    (tmp_path / "nested" / "sub").mkdir(parents=True)
    (tmp_path / "nested" / "config.json").write_text("{}")
    (tmp_path / "nested" / "sub" / "w.bin").write_bytes(b"w")
    for name in ("runs", "home", "flat", "nested"):
        out = tmp_path / name
        before = _files(out)
        assert cli(["export", str(run), str(out), "--overwrite"]) == 2, name
        assert _one_error(capsys).startswith(f"error: export OUT '{out}': not an earlier `yxanul export` output")
        assert _files(out) == before, name
    hf = tmp_path / "hf"
    assert cli(["export", str(run), str(hf), "--max_shard_size", "50KB"]) == 0
    assert len(list(hf.glob("model-*-of-*.safetensors"))) > 1
    assert cli(["export", str(run), str(hf), "--overwrite"]) == 0
    assert (hf / "model.safetensors").is_file() and not list(hf.glob("model-*")) and (hf / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flat", "hf", "home", "nested", "run", "runs"]


def test_export_into_the_current_directory(run, tmp_path, monkeypatch, capsys):
    """OUT = "." (cwd, which cannot be renamed): the files land in it, new and under --overwrite, and no hidden
    folder is left beside it."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert cli(["export", str(run), "."]) == 0
    first = _files(here)
    assert Path("config.json") in first and Path("model.safetensors") in first
    assert cli(["export", str(run), ".", "--overwrite", "--dtype", "fp32"]) == 0
    assert _files(here).keys() == first.keys() and _files(here) != first  # replaced: fp32 weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "run"]
    assert "exported" in capsys.readouterr().out


def test_a_shard_size_below_one_byte_is_one_line(run, tmp_path, capsys):
    for size in ("0GB", "-1GB", "0.0000001KB", "infGB"):
        assert cli(["export", str(run), str(tmp_path / "o"), f"--max_shard_size={size}"]) == 2, size
        assert "'max_shard_size': expected a size such as 5GB or 500MB, above 0" in _one_error(capsys), size
    assert not (tmp_path / "o").exists()


def test_an_out_that_cannot_be_written_is_one_line(run, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    outs = ([Path("/proc/yxanul-x/out")] if Path("/proc").is_dir() else []) + [tmp_path / "file" / "out"]
    for out in outs:
        assert cli(["export", str(run), str(out)]) == 2, out
        assert _one_error(capsys).startswith(f"error: export OUT '{out}': "), out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]
