"""Helpers of the data tests (not tests themselves): synthetic document files, what a prepared folder
holds, and its documents decoded back."""

import json
from pathlib import Path

import numpy as np

from yxanul.data.shards import open_shard
from yxanul.data.tokenizer_load import load_prepared_tokenizer

WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


def write_docs(path: Path, n: int, words: int, tag: str, seed: int = 0) -> Path:
    """n documents of about ``words`` words (lengths vary 1x-3x), each starting with its tag."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            k = int(words * rng.uniform(1, 3))
            body = " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), k))
            f.write(json.dumps({"text": f"{tag} {i}: {body}"}) + "\n")
    return path


def files_of(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def meta_of(out: Path) -> dict:
    meta = json.loads((out / "meta.json").read_text())
    meta.pop("created"), meta.pop("stats")  # when and how fast: the only fields that may differ
    return meta


def split_docs(out: Path, split: str) -> list[str]:
    """Decode a split back into documents (cut at EOS)."""
    meta = json.loads((out / "meta.json").read_text())
    tok = load_prepared_tokenizer(out)
    toks = np.concatenate([open_shard(out / f) for f in meta["splits"][split]["shards"]])
    assert toks[-1] == meta["eos_token_id"]
    cuts = np.flatnonzero(toks == meta["eos_token_id"])
    return [tok.decode(doc[:-1].tolist()) for doc in np.split(toks, cuts + 1)[:-1]]
