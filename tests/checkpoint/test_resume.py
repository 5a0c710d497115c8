"""Which checkpoint a resume or a reader gets: each verified against its manifest, a damaged ``latest``
falling back to the newest good one with one line, a checkpoint named explicitly never swapped, the
pointers kept inside the run."""

import json

import pytest
from _checkpoint import _three

from yxanul.checkpoint import format_table, latest_good_checkpoint, resolve_resume, verified_weights_dir
from yxanul.checkpoint.manifest import verify_checkpoint
from yxanul.errors import UserError


def test_resume_errors(tmp_path):
    assert resolve_resume("latest", tmp_path) is None
    with pytest.raises(UserError, match="not a checkpoint"):
        resolve_resume(str(tmp_path / "nothing"), tmp_path)


def test_a_runs_pointer_file_or_checkpoints_folder_means_what_it_points_at(tmp_path, acc_model):
    """`--resume RUN/checkpoints/latest` (the pointer file, as a user tab-completes it) is the checkpoint it
    names, `RUN/checkpoints` is the run, for every reader (export, eval, generate: verified_weights_dir too)."""
    root = _three(tmp_path, acc_model)
    (root / "best").write_text("step_2\n")
    assert resolve_resume(str(root / "latest"), tmp_path / "new") == root / "step_3"
    assert resolve_resume(str(root / "best"), tmp_path / "new") == root / "step_2"
    assert resolve_resume(str(root), tmp_path / "new") == root / "step_3"
    assert verified_weights_dir(root / "best") == root / "step_2"
    _flip_bit(root / "step_2" / "model.safetensors")  # the pointer names one checkpoint: never swapped
    with pytest.raises(UserError, match=r"damaged checkpoint"):
        resolve_resume(str(root / "best"), tmp_path / "new")


def _flip_bit(p):
    b = bytearray(p.read_bytes())
    b[-3] ^= 0x10
    p.write_bytes(bytes(b))


DAMAGE = {  # name -> (how, a phrase of the problem)
    "flipped bit in the weights": (lambda d: _flip_bit(d / "model.safetensors"), "sha256"),
    "truncated weights": (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:50]),
                          "model.safetensors has"),
    "empty weights": (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors has 0 bytes"),
    "weights missing": (lambda d: (d / "model.safetensors").unlink(), "model.safetensors missing"),
    "optimizer missing": (lambda d: (d / "optimizer.bin").unlink(), "optimizer.bin missing"),
    "optimizer truncated": (lambda d: (d / "optimizer.bin").write_bytes((d / "optimizer.bin").read_bytes()[:9]),
                            "optimizer.bin has"),
    "state not JSON": (lambda d: (d / "trainer_state.json").write_text("{oops"), "not JSON"),
    "state without data": (lambda d: (d / "trainer_state.json").write_text('{"step": 3}'), "no 'data'"),
    "garbage random states": (lambda d: next(d.glob("random_states_*.pkl")).write_bytes(b"garbage"),
                              "random_states_0.pkl"),
    "manifest garbage": (lambda d: (d / "manifest.json").write_text("[1, 2"), "manifest.json is not valid"),
    "state deleted": (lambda d: (d / "trainer_state.json").unlink(), "trainer_state.json missing"),
    # a checkpoint saved with a manifest (trained_on.json is only ever written beside one) that lost it
    "manifest deleted": (lambda d: ((d / "trained_on.json").write_text("{}"), (d / "manifest.json").unlink()),
                         "manifest.json missing (this checkpoint was saved with one"),
    "no manifest (an older save), optimizer truncated": (
        lambda d: ((d / "manifest.json").unlink(), (d / "optimizer.bin").write_bytes((d / "optimizer.bin")
                                                                                      .read_bytes()[:1000])),
        "optimizer.bin is not a whole torch file"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_latest_falls_back_to_the_newest_good_one(tmp_path, acc_model, case):
    root = _three(tmp_path, acc_model)
    how, phrase = DAMAGE[case]
    how(root / "step_3")
    problems = verify_checkpoint(root / "step_3")
    assert problems and phrase in "; ".join(problems), problems
    said = []
    assert resolve_resume("latest", tmp_path, say=said.append) == root / "step_2"
    assert len(said) == 1 and "step_3 is damaged" in said[0] and "resuming from step_2" in said[0], said
    with pytest.raises(UserError, match=r"resume '.*step_3': damaged checkpoint \("):  # named explicitly: no swap
        resolve_resume(str(root / "step_3"), tmp_path)
    with pytest.raises(UserError, match="init_from '.*step_3': damaged checkpoint"):
        verified_weights_dir(root / "step_3")
    assert "DAMAGED: " in format_table(tmp_path).splitlines()[3] and "ok" in format_table(tmp_path).splitlines()[2]


def test_none_verifies_is_one_line_and_pointers_stay_inside_the_run(tmp_path, acc_model):
    root = _three(tmp_path, acc_model)
    other = tmp_path / "other" / "checkpoints" / "step_9"
    other.mkdir(parents=True)
    for name in ("latest", "best"):
        for bad in (b"\x00\xff\xfe binary", b"../../other/checkpoints/step_9\n", str(other).encode()):
            (root / "latest").write_text("step_3\n")
            (root / name).write_bytes(bad)
            said = []
            assert latest_good_checkpoint(tmp_path, say=said.append) == root / "step_3"  # newest that verifies
            assert "pointer" in said[0] if name == "latest" else said == []
            assert "step_3" in format_table(tmp_path)
    for d in ("step_1", "step_2", "step_3"):
        (root / d / "model.safetensors").write_bytes(b"x")
    with pytest.raises(UserError, match=r"no checkpoint under .* verifies: step_3 is damaged .*; step_2 .*; step_1"):
        resolve_resume("latest", tmp_path, say=None)


def test_checkpoint_without_manifest_loads_with_a_note(tmp_path, acc_model):
    root = _three(tmp_path, acc_model)
    (root / "step_3" / "manifest.json").unlink()
    said = []
    assert resolve_resume("latest", tmp_path, say=said.append) == root / "step_3"
    assert len(said) == 1 and said[0].startswith("note: ") and "no manifest.json" in said[0]
    (root / "step_3" / "model.safetensors").write_bytes((root / "step_3" / "model.safetensors").read_bytes()[:-4])
    assert "model.safetensors is truncated" in "; ".join(verify_checkpoint(root / "step_3"))  # basic checks
    state = json.loads((root / "step_2" / "trainer_state.json").read_text())
    (root / "step_2" / "manifest.json").unlink()  # no hashes: the state's own structure is all that is checked
    (root / "step_2" / "trainer_state.json").write_text(json.dumps(dict(state, step=-7)))
    assert "trainer_state.json has a negative 'step' (-7)" in "; ".join(verify_checkpoint(root / "step_2"))
