"""The manifest a save writes last: every file of the checkpoint with its size and the sha256 of each of its
chunks (format 2), hashed in parallel; format 1's whole-file sha256 still verifies."""

import hashlib
import json

from _checkpoint import _three

from yxanul.checkpoint import manifest as mf
from yxanul.checkpoint.manifest import verify_checkpoint


def _chunks(data: bytes, n: int) -> list[str]:
    return [hashlib.sha256(data[i:i + n]).hexdigest() for i in range(0, max(len(data), 1), n)]


def test_manifest_lists_every_file_with_size_and_chunk_sha256s(tmp_path, acc_model):
    root = _three(tmp_path, acc_model)
    m = json.loads((root / "step_3" / "manifest.json").read_text())
    names = {p.name for p in (root / "step_3").iterdir()} - {"manifest.json"}
    assert set(m["files"]) == names and {"model.safetensors", "optimizer.bin", "trainer_state.json"} <= names
    assert (m["format"], m["chunk_bytes"]) == (2, mf.CHUNK_BYTES)
    for name, e in m["files"].items():
        data = (root / "step_3" / name).read_bytes()
        assert e["size"] == len(data) and e["sha256_chunks"] == _chunks(data, mf.CHUNK_BYTES)
    assert m["hash_seconds"] >= 0 and m["bytes"] == sum(e["size"] for e in m["files"].values())
    assert verify_checkpoint(root / "step_3") == []


def test_a_changed_byte_in_any_chunk_of_a_many_chunk_file_is_found(tmp_path, acc_model, monkeypatch):
    """256-byte chunks: the optimizer file is many of them, hashed on every core; a byte changed in a middle chunk
    (same size) is reported, and a manifest of another chunk size is read with its own."""
    monkeypatch.setattr(mf, "CHUNK_BYTES", 256)
    root = _three(tmp_path, acc_model)
    ckpt = root / "step_3"
    m = json.loads((ckpt / "manifest.json").read_text())
    opt = ckpt / "optimizer.bin"
    data = bytearray(opt.read_bytes())
    assert m["chunk_bytes"] == 256 and len(m["files"]["optimizer.bin"]["sha256_chunks"]) == -(-len(data) // 256) > 2
    monkeypatch.setattr(mf, "CHUNK_BYTES", 64 << 20)  # the verifier reads the manifest's chunk size
    assert verify_checkpoint(ckpt) == []
    data[len(data) // 2] ^= 1
    opt.write_bytes(bytes(data))
    assert verify_checkpoint(ckpt) == ["optimizer.bin does not match its sha256 (changed or corrupted since the save)"]
    assert verify_checkpoint(ckpt, state_only=True) == []  # sizes only


def test_a_format_1_manifest_still_verifies(tmp_path, acc_model):
    """Checkpoints saved before the chunks: one whole-file sha256 per file."""
    root = _three(tmp_path, acc_model)
    ckpt = root / "step_3"
    m = json.loads((ckpt / "manifest.json").read_text())
    files = {name: {"size": e["size"], "sha256": hashlib.sha256((ckpt / name).read_bytes()).hexdigest()}
             for name, e in m["files"].items()}
    (ckpt / "manifest.json").write_text(json.dumps({"format": 1, "files": files, "bytes": m["bytes"]}))
    assert verify_checkpoint(ckpt) == []
    data = bytearray((ckpt / "optimizer.bin").read_bytes())
    data[-1] ^= 1
    (ckpt / "optimizer.bin").write_bytes(bytes(data))
    assert verify_checkpoint(ckpt) == ["optimizer.bin does not match its sha256 (changed or corrupted since the save)"]
