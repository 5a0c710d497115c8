"""Fixtures: a prepared dataset and a checkpointed run that uses it (tests/hub/helpers.py); lm-eval's task
folder with the bundled cloze task."""

import pytest
from hub.helpers import prepared, tok_run  # noqa: F401

from yxanul.evaluation.args import BUNDLED

_CLOZE_YAML = """
task: yxanul_cloze
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{ctx}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{endings}}}}"
target_delimiter: ""
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
"""


@pytest.fixture
def cloze_task_dir(tmp_path):
    """A task folder for lm-eval's ``include_path`` holding ``yxanul_cloze``: the bundled cloze task as an
    lm-eval multiple-choice task over its local json file."""
    d = tmp_path / "tasks"
    d.mkdir()
    (d / "yxanul_cloze.yaml").write_text(_CLOZE_YAML.format(path=BUNDLED["cloze"]))
    return d
