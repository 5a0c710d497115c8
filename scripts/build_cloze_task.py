#!/usr/bin/env python
"""Build the bundled Shakespeare cloze task (yxanul/assets/tasks/shakespeare_cloze.jsonl). Deterministic.

    python scripts/build_cloze_task.py            # rewrites the bundled file, prints its sha256
    python scripts/build_cloze_task.py --check    # exit 1 if the bundled file differs from a rebuild

Source: the scenes of the bundled corpus that `yxanul prepare` holds out for validation at
val_fraction 0.01 (the embedded default run, yxanul/assets/default.yaml; at the CLI default 0.005 the
held-out scenes are a subset of these, so every item is unseen by a default `yxanul train`).
Item, in HellaSwag's format: ``ctx`` = the last CONTEXT_LINES lines of a scene before a verse line
(speaker tags included, ending with a newline), ``endings`` = that true next line and DISTRACTORS verse
lines drawn from the other held-out scenes, shuffled; ``label`` = index of the true line.
Chance accuracy is 25 %; a model that learned the plays' style and meter does better.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "yxanul" / "assets" / "corpus" / "shakespeare.jsonl.gz"
OUT = ROOT / "yxanul" / "assets" / "tasks" / "shakespeare_cloze.jsonl"
VAL_FRACTION, CONTEXT_LINES, DISTRACTORS, N_ITEMS, SEED = 0.01, 4, 3, 300, 1234
_SPEAKER = re.compile(r"^[A-Z][A-Z .'-]+:$")


def is_verse(line: str) -> bool:
    s = line.strip()
    return len(s) >= 20 and not _SPEAKER.match(s) and not s.startswith("[")


def held_out_scenes() -> list[tuple[str, list[str]]]:
    sys.path.insert(0, str(ROOT))
    from yxanul.data.prepare import is_val  # the same hashed hold-out as the data preparation

    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [(f"{r.get('play', '?')} {r.get('scene', i)}", [ln for ln in r["text"].splitlines() if ln.strip()])
            for i, r in enumerate(rows) if is_val(i, VAL_FRACTION)]


def build() -> list[dict]:
    scenes = held_out_scenes()
    rng = random.Random(SEED)
    candidates = [(s, j) for s, (_, lines) in enumerate(scenes) for j in range(CONTEXT_LINES, len(lines))
                  if is_verse(lines[j])]
    picked = sorted(rng.sample(candidates, min(N_ITEMS, len(candidates))))
    items = []
    for s, j in picked:
        name, lines = scenes[s]
        pool = [ln for t, (_, other) in enumerate(scenes) if t != s for ln in other if is_verse(ln)]
        endings = [lines[j].strip()] + [d.strip() for d in rng.sample(pool, DISTRACTORS)]
        order = list(range(len(endings)))
        rng.shuffle(order)
        items.append({"ctx": "\n".join(lines[j - CONTEXT_LINES:j]) + "\n", "endings": [endings[o] for o in order],
                      "label": order.index(0), "source": name})
    return items


def render(items: list[dict]) -> bytes:
    return "".join(json.dumps(it, ensure_ascii=False, sort_keys=True) + "\n" for it in items).encode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the bundled file instead of writing")
    args = ap.parse_args()
    data = render(build())
    if args.check:
        same = OUT.is_file() and OUT.read_bytes() == data
        print("bundled cloze task is up to date" if same else f"{OUT} differs from a rebuild")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(data)
    n = data.count(b"\n")
    print(f"{OUT}: {n} items, sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
