"""What a checkpoint was trained on, and the check that a resume continues on the same.

Every checkpoint holds ``trained_on.json`` (covered by its manifest)::

    {"tokenizer": sha256 of the tokenizer's serialized vocabulary, merges and special tokens,
     "dataset": the prepared data's fingerprint (meta.json: sources, tokenizer and prepare settings),
     "dataset_content": the prepared tokens' identity (a hash over the shards' sha256s, train and val),
     "val_split": {"val_fraction": ..., "val_tokens": ...},
     "seq_length": ..., "seed": ...}

Computed once when the run starts (`record`), never per step. On resume (`check`) any difference
is one line naming what changed (old -> new), exit 2, unless ``--resume_allow_changes`` names it:
then one line per allowed change says what it does to the run. A checkpoint written before these
records existed resumes with one line saying that it could not be checked.

The fingerprint holds each local source file's path, size and modification time (a cheap identity, read
before anything is tokenized), so a dataset copied to another cluster, moved or touched gets a new one. The
tokens decide: prepared again to the same tokens (``dataset_content``), the resume continues at its data
position with one note; other tokens under the same settings are a changed ``dataset``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from ..checkpoint.io import saved_config, write_atomic
from ..checkpoint.manifest import PROVENANCE as FILE
from ..checkpoint.resume import likely_resume
from ..data.prepare import planned_fingerprint
from ..errors import UserError

NAMES = ("tokenizer", "dataset", "val_split", "seq_length", "seed")
CONSEQUENCE = {
    "tokenizer": "the embeddings were learned for other token ids: the loss starts again from far off",
    "dataset": "the saved data position does not apply to other data: training reads it from its start (epoch 0)",
    "val_split": "val losses before and after this step measure other validation sets; `best` compares them anyway",
    "seq_length": "the window grid changes: data order restarts at epoch {next_epoch} (the rest of epoch {epoch} "
                  "is skipped)",
    "seed": "the window order changes: data order restarts at epoch {next_epoch} (the rest of epoch {epoch} is "
            "skipped)",
}


def tokenizer_hash(tokenizer) -> str | None:
    """sha256 of the tokenizer's full serialization (vocabulary, merges, normalizer, special tokens)."""
    if tokenizer is None:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def content_hash(meta: dict) -> str | None:
    """The prepared tokens' identity: a hash over every shard's token count and sha256 (prepare's manifest), train
    then val, in reading order; None where a shard has no sha256 (older prepared data). Where the files live and
    when they were written are not in it."""
    parts = []
    for split in ("train", "val"):
        for e in ((meta.get("splits") or {}).get(split) or {}).get("manifest") or []:
            if not e.get("sha256"):
                return None
            parts.append(f"{split} {e.get('tokens')} {e['sha256']}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16] if parts else None


def record(cfg, data_dir, tokenizer) -> dict:
    """The trained-on record of this run (read once at setup)."""
    meta = json.loads((Path(data_dir) / "meta.json").read_text())
    return {"tokenizer": tokenizer_hash(tokenizer), "dataset": meta.get("fingerprint"),
            "dataset_content": content_hash(meta),
            "val_split": {"val_fraction": cfg.data.val_fraction,
                          "val_tokens": (meta.get("splits") or {}).get("val", {}).get("tokens")},
            "seq_length": cfg.model.seq_length, "seed": cfg.train.seed}


def write(ckpt_dir: Path, rec: dict) -> None:
    write_atomic(Path(ckpt_dir) / FILE, json.dumps(rec, indent=1))


def _show(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {w}" for k, w in v.items())
    return str(v)


def _refuse(ckpt, changes: dict, allowed: set) -> None:
    """One line naming each change (``name: old -> new``) that ``allowed`` does not name, exit 2."""
    refused = [n for n in changes if n not in allowed and "all" not in allowed]
    if refused:
        what = "; ".join(f"{n}: {_show(changes[n][0])} -> {_show(changes[n][1])}" for n in refused)
        raise UserError(f"resume '{ckpt}': trained on other data settings ({what}); if intended, add "
                        f"--resume_allow_changes {' '.join(refused)}")


def precheck(cfg, run_dir) -> None:
    """`check`'s refusal before the data is prepared (hours, for a large dataset; the refused data would be
    prepared for nothing): what the config alone decides -- the dataset's fingerprint (sources, tokenizer,
    prepare settings), ``val_fraction``, ``seq_length``, ``seed`` -- against the checkpoint a ``--resume`` will
    most likely continue (`likely_resume`: not verified yet). `check`, after preparing, stays the authority."""
    if not cfg.checkpoint.resume:
        return
    ckpt = likely_resume(cfg.checkpoint.resume, run_dir)
    try:
        old = json.loads((Path(ckpt) / FILE).read_text()) if ckpt is not None else None
    except (OSError, ValueError):
        return  # none (an older checkpoint) or unreadable: `check` says so after the checkpoint is verified
    if not isinstance(old, dict):
        return
    val = old.get("val_split") if isinstance(old.get("val_split"), dict) else {}
    now = {"dataset": planned_fingerprint(cfg.data), "seq_length": cfg.model.seq_length, "seed": cfg.train.seed}
    changes = {n: (old[n], v) for n, v in now.items() if n in old and v is not None and old[n] != v}
    if "val_fraction" in val and val["val_fraction"] != cfg.data.val_fraction:
        changes["val_split"] = ({"val_fraction": val["val_fraction"]}, {"val_fraction": cfg.data.val_fraction})
    if "dataset" in changes:
        changes = _dataset_change(cfg.data, ckpt, old, changes)
    _refuse(ckpt, changes, set(cfg.checkpoint.resume_allow_changes or ()))


LOCATION_KEYS = ("dataset", "datasets", "data_dir", "tokenizer")  # where the data is, not what it is


def _dataset_change(data, ckpt, old: dict, changes: dict) -> dict:
    """``changes`` with the dataset's explained: a fingerprint alone says nothing, the data settings that differ
    say why. Where only the data's location differs (a local file or folder moved, copied or touched) and the
    checkpoint records its tokens, the change is left to `check`: the tokens, once prepared, decide."""
    saved = saved_config(ckpt)
    keys = [f.name for f in dataclasses.fields(data) if f.name in saved and saved[f.name] != getattr(data, f.name)]
    # no differing key (all() of nothing: True) is a file touched or copied in place: also the tokens' to decide
    local = all(k in LOCATION_KEYS and (k == "datasets" or Path(str(getattr(data, k))).exists()) for k in keys)
    if old.get("dataset_content") and local:
        return {n: v for n, v in changes.items() if n != "dataset"}
    if "tokenizer" in keys:  # `check` would name it too (its hash)
        changes = {"tokenizer": (saved["tokenizer"], data.tokenizer), **changes}
    why = ", ".join(f"{k} {saved[k]} -> {getattr(data, k)}" for k in keys if k != "tokenizer")
    if not why and not keys:  # the fingerprint holds each source file's path, size and modification time too
        why = ("the same data settings: a source file was moved, touched or changed since; if its content is "
               "the same, allowing it resumes with the data read from its start")
    if why:
        changes["dataset"] = (f"{changes['dataset'][0]}", f"{changes['dataset'][1]} ({why})")
    return changes


def check(ckpt: Path, rec: dict, allowed: list[str] | None, data_state: dict | None, say) -> list[str]:
    """Refuse (one line, exit 2) a resume whose records differ from the checkpoint's, unless allowed.
    Returns the names of the allowed changes."""
    path = Path(ckpt) / FILE
    if not path.is_file():
        say(f"note: {ckpt} records no tokenizer, dataset, val split, seq_length or seed (saved by an older "
            "yxanul): the resume could not check that they are unchanged")
        return []
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"resume '{ckpt}': {FILE} is not JSON") from None
    changes = {n: (old[n], rec.get(n)) for n in NAMES if n in old and old[n] != rec.get(n)}
    was, now = old.get("dataset_content"), rec.get("dataset_content")
    if was and now and was == now and "dataset" in changes:  # moved, copied or touched: the same tokens
        say(f"note: resume '{ckpt}': the dataset's fingerprint changed ({old['dataset']} -> {rec.get('dataset')}: "
            f"a source file was moved, copied or touched) but its prepared tokens are the same ({now}): "
            "training continues at the saved data position")
        del changes["dataset"]
    elif was and now and was != now:  # other tokens, whatever the settings say
        changes["dataset"] = (f"{old.get('dataset')} (tokens {was})", f"{rec.get('dataset')} (tokens {now})")
    changed = list(changes)
    allowed = set(allowed or ())
    _refuse(ckpt, changes, allowed)
    epoch = int((data_state or {}).get("epoch", 0))
    for n in changed:
        say(f"warning: resume with another {n} ({_show(changes[n][0])} -> {_show(changes[n][1])}), allowed: "
            + CONSEQUENCE[n].format(epoch=epoch, next_epoch=epoch + 1))
    return changed
