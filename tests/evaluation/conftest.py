"""A small prepared dataset (the bundled corpus and tokenizer) and a run trained on nothing but saved like
the trainer saves, whose config.yaml points at that data: what `yxanul generate|eval` read."""

import pytest

from tests.hub.test_export import random_model, save_run


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    from yxanul.data.args import DataArgs
    from yxanul.data.prepare import prepare

    d = tmp_path_factory.mktemp("data") / "d"
    return prepare(DataArgs(data_dir=str(d), max_documents=40, val_fraction=0.2), progress=False,
                   say=lambda *a, **k: None)


@pytest.fixture
def tok_run(tmp_path, prepared):
    """(run dir, its model): a tiny 8192-vocabulary model checkpointed with data_dir = the prepared folder."""
    import yaml

    model = random_model(2, False, 8192, seed=5)
    run = tmp_path / "run"
    save_run(model, run, te_views=False)
    for cfg_file in (run / "checkpoints" / "step_2" / "config.yaml",):
        cfg = yaml.safe_load(cfg_file.read_text())
        cfg_file.write_text(yaml.safe_dump(dict(cfg, data_dir=str(prepared))))
    return run, model
