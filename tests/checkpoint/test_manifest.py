"""The manifest a save writes last: every file of the checkpoint with its size and sha256."""

from _checkpoint import _three

from yxanul.checkpoint.manifest import verify_checkpoint


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path, acc_model):
    import hashlib
    import json

    root = _three(tmp_path, acc_model)
    m = json.loads((root / "step_3" / "manifest.json").read_text())
    names = {p.name for p in (root / "step_3").iterdir()} - {"manifest.json"}
    assert set(m["files"]) == names and {"model.safetensors", "optimizer.bin", "trainer_state.json"} <= names
    for name, e in m["files"].items():
        data = (root / "step_3" / name).read_bytes()
        assert e["size"] == len(data) and e["sha256"] == hashlib.sha256(data).hexdigest()
    assert m["hash_seconds"] >= 0 and m["bytes"] == sum(e["size"] for e in m["files"].values())
    assert verify_checkpoint(root / "step_3") == []
