"""The trainer's loaders (yxanul/training/loaders.py): the validation batches it evaluates, and what it says
when they are fewer than eval_steps asks."""

import json
import re

import pytest
from accelerate import PartialState

from yxanul.config import parse_args
from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.errors import DataError
from yxanul.training.loaders import prepared_data, val_batches


def test_fewer_validation_batches_than_eval_steps_are_said_once(tmp_path):
    data = prepare(DataArgs(data_dir=str(tmp_path / "d"), max_documents=60, val_fraction=0.2), progress=False,
                   say=lambda *a, **k: None)
    state = PartialState(cpu=True)
    said = []
    few = val_batches(data, parse_args(["--seq_length", "32", "--eval_steps", "2"]), 4, state, said.append)
    assert len(few) == 2 and said == []  # as many as asked: nothing to say
    every = val_batches(data, parse_args(["--seq_length", "32", "--eval_steps", "100000", "--data_dir", str(data)]),
                        4, state, said.append)
    assert 2 < len(every) < 100000
    assert said == [f"eval: {len(every)} validation batches of 4 x 32 tokens, not eval_steps 100000: the split "
                    "holds no more (for more: prepare the data again with a larger val_fraction (`yxanul prepare "
                    f"--dataset ... --val_fraction X` into another --data_dir, or after deleting '{data}'))"]


def test_val_fraction_does_not_split_a_prepared_folder_again_and_the_advice_says_what_does(tmp_path):
    """A data_dir given alone keeps the split `yxanul prepare` made: a val_fraction set to another one is one
    warning, and a split too small for evaluation asks for what works there (prepare again), not for a larger
    val_fraction, which does work where the trainer prepares the data from --dataset."""
    docs = tmp_path / "a.jsonl"
    docs.write_text("\n".join(json.dumps({"text": f"Line {i}: " + "word " * (i % 13 + 20)}) for i in range(80)))
    d = str(prepare(DataArgs(dataset=str(docs), data_dir=str(tmp_path / "d"), val_fraction=0.05), progress=False,
                    say=lambda *a, **k: None))
    state, said = PartialState(cpu=True), []
    for flags in ([], ["--val_fraction", "0.05"]):  # not set, or set to the prepared split: nothing to say
        prepared_data(parse_args(["--data_dir", d, *flags]), state, said.append)
    assert said == []
    cfg = parse_args(["--data_dir", d, "--val_fraction", "0.3", "--seq_length", "32"])
    prepared_data(cfg, state, said.append)
    again = f"`yxanul prepare --dataset ... --val_fraction X` into another --data_dir, or after deleting '{d}'"
    assert said == [f"warning: val_fraction 0.3 does not change data_dir '{d}': its split is the one `yxanul prepare` "
                    f"made (val_fraction 0.05); to change it, prepare it again: {again}"]
    with pytest.raises(DataError) as e:
        val_batches(d, cfg, 10**6, state)
    assert re.fullmatch(r"validation split has \d+ windows of 33 tokens; evaluation needs micro_batch_size x "
                        r"world_size = 1000000: lower micro_batch_size or prepare the data again with a larger "
                        rf"val_fraction \({re.escape(again)}\)", str(e.value)), e.value
    with pytest.raises(DataError, match=re.escape(f"need at least seq_length+1 = 4097: lower seq_length or prepare the "
                                                  f"data again with a larger val_fraction ({again})")):
        val_batches(d, parse_args(["--data_dir", d, "--seq_length", "4096"]), 1, state)
    # prepared here from --dataset, a larger val_fraction is the way (into another folder than the one it fills)
    small = ["--dataset", str(docs), "--data_dir", str(tmp_path / "d2"), "--val_fraction", "0.05", "--seq_length", "32"]
    d2, _, _ = prepared_data(parse_args(small), state, said.append)
    n = int(re.search(r"has (\d+) windows", str(e.value))[1])
    with pytest.raises(DataError, match=re.escape(f"lower micro_batch_size or raise val_fraction (with another "
                                                  f"data_dir: '{d2}' holds this split)")):
        val_batches(d2, parse_args(small), n + 1, state)
    larger = parse_args([*small[:3], str(tmp_path / "d3"), "--val_fraction", "0.3", "--seq_length", "32"])
    assert val_batches(prepared_data(larger, state, said.append)[0], larger, n + 1, state)
