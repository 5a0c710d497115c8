"""One very long document with `--prepare_backend tokenizers`: `tokenizers` keeps per-byte alignments of
the whole text (a 50 MB document peaked at 8.3 GB), so long documents are encoded in pieces cut where a
whitespace pre-tokenizer starts a word anyway -- the same ids, bounded memory (yxanul/data/tokenize.py).
Measured (`yxanul prepare --prepare_backend tokenizers --prepare_num_proc 1`, /usr/bin/time -v): one 10 MB
document 2.00 GB -> 0.88 GB peak RSS, one 50 MB document 1.69 GB after (8.3 GB reported before); the
10 MB shards are byte-identical before/after and to the tiktoken backend's."""

import gzip
import json
import subprocess
import sys

from yxanul.data.sources import BUNDLED_CORPUS

_PEAK = """
import json, resource, sys
from yxanul.data.tokenizer_load import load_tokenizer
from yxanul.data.tokenize import Encoder
_, tok = load_tokenizer(None)
enc = Encoder(tok.backend_tokenizer.to_str(), tok.eos_token_id, "uint16").build(single_thread=True)
text = open(sys.argv[1]).read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = enc([text])[0]
print(json.dumps({"grew_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, "ids": len(ids)}))
"""


def _corpus(chars: int) -> str:
    texts = [json.loads(line)["text"] for line in gzip.open(BUNDLED_CORPUS, "rt")]
    blob = "\n\n".join(texts)
    return (blob * (chars // len(blob) + 1))[:chars]


def test_a_long_document_is_encoded_in_pieces_with_the_same_ids():
    from tokenizers import Tokenizer

    from yxanul.data.tokenize import _chunked, _split_safe
    from yxanul.data.tokenizer_load import load_tokenizer

    t = Tokenizer.from_str(load_tokenizer(None)[1].backend_tokenizer.to_str())
    t.encode_special_tokens = True

    def raw(texts):
        return t.encode_batch_fast(texts, add_special_tokens=False)

    text = _corpus(400_000)
    assert _split_safe(raw)
    assert _chunked(raw, [text, "short"], size=4096) == [e.ids for e in raw([text, "short"])]


def test_one_very_long_document_keeps_the_tokenizers_backend_memory_bounded(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(_corpus(6 << 20))  # 6 MB: whole, `tokenizers` grew ~1.2 GB for it
    r = subprocess.run([sys.executable, "-c", _PEAK, str(doc)], capture_output=True, text=True, timeout=600)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # pieces of 1 MB: alignments of one piece at a time (~200 bytes/char) plus the ids (~2 per 7 chars):
    # far below the ~200 bytes per character of the whole document
    assert out["ids"] > 1_500_000 and out["grew_kb"] * 1024 < 60 * (6 << 20), out
