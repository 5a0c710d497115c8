"""The trainer's loaders (yxanul/training/loaders.py): the validation batches it evaluates, and what it says
when they are fewer than eval_steps asks."""

from accelerate import PartialState

from yxanul.config import parse_args
from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.training.loaders import val_batches


def test_fewer_validation_batches_than_eval_steps_are_said_once(tmp_path):
    data = prepare(DataArgs(data_dir=str(tmp_path / "d"), max_documents=60, val_fraction=0.2), progress=False,
                   say=lambda *a, **k: None)
    state = PartialState(cpu=True)
    said = []
    few = val_batches(data, parse_args(["--seq_length", "32", "--eval_steps", "2"]), 4, state, said.append)
    assert len(few) == 2 and said == []  # as many as asked: nothing to say
    every = val_batches(data, parse_args(["--seq_length", "32", "--eval_steps", "100000"]), 4, state, said.append)
    assert 2 < len(every) < 100000
    assert said == [f"eval: {len(every)} validation batches of 4 x 32 tokens, not eval_steps 100000: the split "
                    "holds no more (more: a larger val_fraction)"]
