"""Local stand-ins for seed 004's four sources, cut from the bundled corpus (no Hub, no download).

``python -m yxanul.data.twin DIR`` writes what examples/configs/seed004_cpu_twin.yaml reads:

    fineweb_edu.jsonl   speeches (a speaker's turn: tens of tokens), like short web pages
    cosmopedia.jsonl    scenes' first 40 lines (hundreds of tokens), like generated textbook sections
    finepdfs.parquet    whole scenes (thousands of tokens), like long PDF extractions
    qa.jsonl            question / options (a dict A-D) / answer_idx / answer columns, like MedQA: the
                        config builds its text with a text_template; 200 rows (about 11K tokens), far too
                        few for its 10 % share, like MedQA's ~2M tokens for 10 % of 11B: the config reads it
                        max_epochs times and drops it (on_source_end: drop)

Document lengths differ by two orders of magnitude between sources, as between the real ones: what
makes a share of tokens (``mix_by: tokens``) differ from a share of documents.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

from .sources import BUNDLED_CORPUS

_SPEAKER = re.compile(r"^([A-Z][A-Z .']+):$")
QA_ROWS = 200


def _scenes() -> list[str]:
    with gzip.open(BUNDLED_CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _speeches(scene: str) -> list[tuple[str, str]]:
    out = []
    for block in scene.split("\n\n"):
        lines = block.split("\n")
        m = _SPEAKER.match(lines[0])
        if m and len(lines) > 1:
            out.append((m.group(1).title(), "\n".join(lines[1:])))
    return out


def write_twin(out_dir: str | Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scenes = _scenes()
    speeches = [s for scene in scenes for s in _speeches(scene)]
    paths = {k: out / f for k, f in (("fineweb_edu", "fineweb_edu.jsonl"), ("cosmopedia", "cosmopedia.jsonl"),
                                       ("finepdfs", "finepdfs.parquet"), ("qa", "qa.jsonl"))}

    def jsonl(path, texts):
        path.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    jsonl(paths["fineweb_edu"], [f"{who}: {text}" for who, text in speeches])
    jsonl(paths["cosmopedia"], ["\n".join(s.split("\n")[:40]) for s in scenes])
    pq.write_table(pa.table({"text": scenes, "id": list(range(len(scenes)))}), paths["finepdfs"])
    _qa(paths["qa"], speeches[::len(speeches) // QA_ROWS][:QA_ROWS])
    return paths


def _qa(path: Path, speeches: list[tuple[str, str]]) -> None:
    """MedQA's columns: the speaker of a speech's first line among four speakers (deterministic)."""
    speakers = sorted({who for who, _ in speeches})
    rows = []
    for i, (who, text) in enumerate(speeches):
        others = dict.fromkeys(s for s in (speakers[(i * 7 + k * 13) % len(speakers)] for k in range(1, 9)) if s != who)
        choices = list(others)[:3]
        choices.insert(i % (len(choices) + 1), who)
        options = dict(zip("ABCD", choices))
        letter = next(k for k, v in options.items() if v == who)
        rows.append({"question": f"Who says \"{text.splitlines()[0]}\"?", "options": options,
                     "answer_idx": letter, "answer": who})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    for name, path in write_twin(sys.argv[1] if len(sys.argv) > 1 else "data/twin").items():
        print(f"{name}: {path}")
