"""tiktoken as a faster exact path for GPT-2-family byte-level BPE tokenizers.

tiktoken's BPE merges the adjacent pair whose concatenation has the lowest rank; a `tokenizers` BPE
applies its merge list in order. With rank = token id the two agree when merged tokens were added to
the vocabulary in merge order (GPT-2's, and every BPE `tokenizers` trains). No BPE file is downloaded:
the ranks are built from the tokenizer's own vocabulary (``tiktoken.get_encoding("gpt2")`` would
fetch one from the internet, which this machine cannot reach). Because agreement is a property of the
vocabulary, it is checked on real text (a sample of the bundled corpus plus mixed Unicode, code and
whitespace) before tiktoken is used; any difference and the `tokenizers` path is used instead.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from functools import lru_cache

from ..errors import DataError
from .sources import BUNDLED_CORPUS

# GPT-2's pre-tokenization regex (= the one `tokenizers`' ByteLevel uses with use_regex=True)
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_EXTRA = ["naïve café — 東京 🚀 Ελληνικά", "def f(x):\n\treturn x**2  # ok\n\n\n", "  leading   spaces\r\n",
          "It's we'll they've I'd 1234567 3.14159", "<|endoftext|> is text here", "x" * 300]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character table (as in GPT-2's encoder.py and `tokenizers` ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@lru_cache(maxsize=1)
def sample_texts() -> list[str]:
    with gzip.open(BUNDLED_CORPUS, "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for _, line in zip(range(40), f)]
    return docs + _EXTRA


def _eligible(tok) -> dict | None:
    """The tiktoken spec of a GPT-2-style byte-level BPE, or None."""
    data = json.loads(tok.backend_tokenizer.to_str())
    pre, model = data.get("pre_tokenizer") or {}, data.get("model") or {}
    if model.get("type") != "BPE" or data.get("normalizer") or pre.get("type") != "ByteLevel" or \
            not pre.get("use_regex", True) or pre.get("add_prefix_space") or model.get("byte_fallback"):
        return None
    decode = {c: b for b, c in _bytes_to_unicode().items()}
    special = {t["content"] for t in data.get("added_tokens", [])}
    try:
        ranks = {bytes(decode[c] for c in s): i for s, i in model["vocab"].items() if s not in special}
    except KeyError:  # a vocabulary entry that is not byte-level
        return None
    if len(ranks) < 256 or any(bytes([b]) not in ranks for b in range(256)):
        return None
    return {"pat_str": GPT2_PATTERN, "mergeable_ranks": ranks}


def build_encoding(spec: dict):
    import tiktoken

    return tiktoken.Encoding(name="yxanul-bpe", pat_str=spec["pat_str"], mergeable_ranks=spec["mergeable_ranks"],
                             special_tokens={})


def tiktoken_spec(tok, required: bool = False) -> dict | None:
    """The spec when tiktoken is installed and gives ``tok``'s ids on real text; else None (or a
    one-line error when ``required``)."""
    why = None
    if importlib.util.find_spec("tiktoken") is None:
        why = "tiktoken is not installed (pip install tiktoken)"
    spec = None if why else _eligible(tok)
    if why is None and spec is None:
        why = "the tokenizer is not a GPT-2-style byte-level BPE"
    ordinary = [t.content for t in tok.added_tokens_decoder.values() if not t.special]
    if why is None and ordinary:  # HF matches these in the text before BPE; tiktoken would split them into bytes
        why = f"the tokenizer has added tokens that are not special ({', '.join(map(repr, ordinary[:3]))})"
    if why is None:
        texts = sample_texts()
        ours = build_encoding(spec).encode_ordinary_batch(texts)
        ref = tok(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if ours != ref:
            why = "tiktoken's ids differ from the tokenizer's on real text"
    if why and required:
        raise DataError(f"prepare_backend 'tiktoken': {why}; use 'auto' or 'tokenizers'")
    return None if why else spec
