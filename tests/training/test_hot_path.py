"""The per-step host work the trainer skips (accelerate's wrappers, lists rebuilt every step): each shortcut is
taken where it applies, and gives what the call it replaces gives."""

from tiny_run import FAST


def _trainer(tmp_path, *extra):
    from yxanul.config import parse_args
    from yxanul.training import Trainer

    return Trainer(parse_args([*FAST, "--max_steps", "4", "--checkpoint_freq", "0", "--save_final", "false",
                               "--output_dir", str(tmp_path / "run"), *extra])).setup()


def test_the_unwrapped_model_is_unwrapped_once_per_model_object(tmp_path, monkeypatch):
    """`Trainer.unwrapped_model` is accelerate's ``unwrap_model`` of the model the trainer holds (compiled here),
    asked once: reading it again costs no ``unwrap_model`` call; another ``trainer.model`` is unwrapped anew."""
    t = _trainer(tmp_path, "--torch_compile")
    acc = t.accelerator
    assert t.model is not t.model._orig_mod  # compiled: unwrap_model keeps the compiled wrapper
    assert t.unwrapped_model is acc.unwrap_model(t.model)
    calls = []
    unwrap = acc.unwrap_model
    monkeypatch.setattr(acc, "unwrap_model", lambda m, *a, **k: calls.append(m) or unwrap(m, *a, **k))
    for _ in range(3):
        assert t.unwrapped_model is unwrap(t.model)
    assert calls == []  # cached
    t.model = t.model._orig_mod  # what a path that re-wraps the model does: another object
    assert t.unwrapped_model is unwrap(t.model) is t.model and len(calls) == 1
    assert t.unwrapped_model is t.model and len(calls) == 1
    t.finish()
