"""Every repository path a file names exists: a doc, config comment or message that sends a user to a file that
was renamed or never written (`examples/slurm/submit_fsdp2.sh`) fails here, not on a user's cluster."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("examples", "accelerate_configs", "ds_configs", "sweeps", "docs", "scripts", "tests", "yxanul")
EXT = "py|sh|yaml|yml|json|jsonl|md|png|xml|txt|gz"
NAMED = re.compile(rf"(?<![\w/.-])((?:{'|'.join(TOPS)})/[\w./-]*\.(?:{EXT}))(?![\w-])")
ELSEWHERE = ("examples/pytorch/",)  # Transformer Engine's own examples, named in docs as theirs
PLACEHOLDER = re.compile(r"\.\.\.|/[A-Z]\.|zeroN\.")  # accelerate_configs/X.yaml, ds_configs/zeroN.json


def _named_paths():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if not f.endswith((".md", ".yaml", ".yml", ".sh", ".py", ".cfg", ".toml")) or not (ROOT / f).is_file() \
                or f == "tests/test_repo_paths.py":  # its own examples of missing paths
            continue
        for m in NAMED.finditer((ROOT / f).read_text(errors="ignore")):
            path = m.group(1).rstrip(".")
            if not path.startswith(ELSEWHERE) and not PLACEHOLDER.search(path):
                yield f, path


def test_every_path_a_file_names_exists():
    missing = sorted({(path, f) for f, path in _named_paths() if not (ROOT / path).exists()})
    assert missing == [], missing


def test_the_check_sees_a_renamed_file():
    text = "see examples/slurm/submit_fsdp2.sh and yxanul/assets/corpus/shakespeare.json (now .jsonl.gz)"
    found = [m.group(1) for m in NAMED.finditer(text)]
    assert found == ["examples/slurm/submit_fsdp2.sh", "yxanul/assets/corpus/shakespeare.json"]
    assert [m.group(1) for m in NAMED.finditer("yxanul/assets/corpus/shakespeare.jsonl.gz")] == [
        "yxanul/assets/corpus/shakespeare.jsonl.gz"]
