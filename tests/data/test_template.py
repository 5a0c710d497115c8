"""text_template: several columns as one document (MedQA's question / options / answer), in a real prepare."""

import json
import subprocess
import sys

import pytest
from _data import split_docs

from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.data.template import render, template_fields
from yxanul.data.tokenizer_load import load_tokenizer
from yxanul.errors import ConfigError, DataError

MEDQA = "Question: {question}\nOptions:\n{options}\nAnswer: {answer_idx}. {answer}"
Q = {"progress": False, "say": lambda *a, **k: None}


def _qa_rows(n):
    return [{"question": f"Which drug treats case {i}?", "options": {"A": "Ampicillin", "B": f"Drug {i}",
             "C": "Doxycycline", "D": "Nitrofurantoin"}, "answer_idx": "B", "answer": f"Drug {i}",
             "meta_info": "step1"} for i in range(n)]


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_render_writes_a_dict_field_one_option_per_line():
    row = _qa_rows(1)[0]
    assert render(MEDQA, row) == ("Question: Which drug treats case 0?\nOptions:\nA. Ampicillin\nB. Drug 0\n"
                                  "C. Doxycycline\nD. Nitrofurantoin\nAnswer: B. Drug 0")
    assert render("{options[C]} / {tags} / {none}|", {"options": row["options"], "tags": ["x", "y"], "none": None}) \
        == "Doxycycline / x\ny / |"
    assert render("{o}", {"o": {"A": "a", "E": None}}) == "A. a"  # a struct's missing key is left out
    assert template_fields(MEDQA) == ["question", "options", "answer_idx", "answer"]


@pytest.mark.parametrize("bad", ["Question: {question", "no fields", "{}", "{0}", ""])
def test_malformed_templates_are_config_errors(bad):
    with pytest.raises(ConfigError, match="text_template"):
        DataArgs(datasets=[{"path": "x.jsonl", "text_template": bad}])
    with pytest.raises(ConfigError, match="not both"):
        DataArgs(datasets=[{"path": "x.jsonl", "text_template": "{q}", "text_column": "q"}])


def test_text_template_and_text_column_together_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"'text_template': expected text_template or text_column, not both"):
        DataArgs(dataset="x.jsonl", text_template="{question}", text_column="question")
    qa = _jsonl(tmp_path / "qa.jsonl", _qa_rows(20))
    r = subprocess.run([sys.executable, "-m", "yxanul", "prepare", "--dataset", qa, "--text_template", "{question}",
                        "--text_column", "answer", "--data_dir", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not both" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_a_field_that_is_a_method_is_refused_not_rendered(tmp_path):
    qa = _jsonl(tmp_path / "qa.jsonl", _qa_rows(20))
    with pytest.raises(DataError, match=r"qa.jsonl': text_template cannot be applied to its first example "
                                        r"\(ValueError: \{question.upper\} is a method, not a value"):
        prepare(DataArgs(dataset=qa, text_template="{question.upper}", data_dir=str(tmp_path / "o")), **Q)
    assert render("{n.real}", {"n": 3}) == "3"  # an attribute that is a value still renders


def test_missing_field_is_one_line_naming_source_and_field(tmp_path):
    qa = _jsonl(tmp_path / "qa.jsonl", _qa_rows(20))
    with pytest.raises(DataError, match=r"dataset '.*qa.jsonl': text_template field 'explanation' is not a column "
                                        r"of its first example \(columns: question, options, answer_idx"):
        prepare(DataArgs(dataset=qa, text_template="{question} {explanation}", data_dir=str(tmp_path / "o")), **Q)
    assert not (tmp_path / "o").exists()
    r = subprocess.run([sys.executable, "-m", "yxanul", "prepare", "--dataset", qa, "--text_template",
                        "{question} {explanation}", "--data_dir", str(tmp_path / "o2")],
                       capture_output=True, text=True, timeout=300)
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("Generating")]
    assert r.returncode == 2 and len(lines) == 1 and "'explanation'" in lines[0], r.stderr


@pytest.mark.parametrize("streaming", [False, True])
def test_a_later_example_the_template_cannot_take_is_one_line_naming_it(tmp_path, streaming):
    rows = [{"q": f"question {i}", "s": i / 2} for i in range(30)] + [{"q": "no score", "s": None}]
    data = _jsonl(tmp_path / "s.jsonl", rows)
    with pytest.raises(DataError, match=r"dataset '.*s.jsonl': text_template cannot be applied to its example 30 "
                                        r"\(TypeError: unsupported format string passed to NoneType"):
        prepare(DataArgs(dataset=data, text_template="{q} {s:.1f}", streaming=streaming,
                         data_dir=str(tmp_path / "o")), **Q)
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob("o.*"))  # nothing left to resume


@pytest.mark.parametrize("streaming", [False, True])
def test_templated_source_in_a_mixture_has_the_expected_tokens(tmp_path, streaming):
    """The QA source ends the mixture, so all of its documents are in: its tokens are exactly the
    tokenizer's tokens of each rendered document plus one EOS."""
    rows = _qa_rows(40)
    qa = _jsonl(tmp_path / "qa.jsonl", rows)
    web = _jsonl(tmp_path / "web.jsonl", [{"text": f"page {i}: " + "words " * 30} for i in range(1500)])
    args = DataArgs(datasets=[{"path": web, "weight": 0.9}, {"path": qa, "weight": 0.1, "text_template": MEDQA}],
                    streaming=streaming, prepare_num_proc=1, data_dir=str(tmp_path / "o"), val_fraction=0.05)
    lines = []
    out = prepare(args, progress=False, say=lines.append)
    tok = load_tokenizer(None)[1]
    expected = sum(len(tok(render(MEDQA, r), add_special_tokens=False)["input_ids"]) + 1 for r in rows)
    rep = json.loads((out / "meta.json").read_text())["mixture"]
    assert rep[qa]["documents"] == 40 and rep[qa]["tokens"] == expected
    assert any(f"the mixture ended when '{qa}' ran out" in x for x in lines), lines


def test_a_top_level_template_is_the_default_of_mixture_entries_as_text_column_is(tmp_path):
    """An entry that sets neither text_column nor text_template reads the top-level template; one that sets a
    column reads that column. The template was ignored under datasets while text_column applied."""
    rows = _qa_rows(30)
    qa, qa2 = _jsonl(tmp_path / "qa.jsonl", rows), _jsonl(tmp_path / "qa2.jsonl", rows)
    args = DataArgs(datasets=[{"path": qa}, {"path": qa2, "text_column": "question"}], text_template="Q: {answer}",
                    on_source_end="drop", data_dir=str(tmp_path / "o"), val_fraction=0.1)
    out = prepare(args, **Q)
    docs = split_docs(out, "train") + split_docs(out, "val")
    assert sorted(docs) == sorted([f"Q: {r['answer']}" for r in rows] + [r["question"] for r in rows])


def test_a_flag_template_writes_backslash_n_and_t_as_newline_and_tab_as_yaml_double_quotes_do(tmp_path):
    r"""The shell passes --text_template "Q: {question}\nA: {answer}" as backslash + n (docs/data.md's example):
    the documents get a newline, as from YAML's "\n"; \\ is one backslash. Same in `yxanul tokenizer train`."""
    from yxanul.data.tokenizer_train import TokenizerTrainCommand, sample_and_held_out
    from yxanul.flags import parse_command
    from yxanul.tools.prepare import parse_prepare_args

    rows = _qa_rows(20)
    qa = _jsonl(tmp_path / "qa.jsonl", rows)
    flag = r"Q: {question}\nA:\t{answer} \\n"
    want = sorted(f"Q: {r['question']}\nA:\t{r['answer']} \\n" for r in rows)
    out = prepare(parse_prepare_args(["--dataset", qa, "--text_template", flag, "--data_dir", str(tmp_path / "o")]),
                  **Q)
    assert sorted(split_docs(out, "train") + split_docs(out, "val")) == want
    cmd = parse_command(TokenizerTrainCommand, ["train", "--dataset", qa, "--out", str(tmp_path / "t"),
                                                "--text_template", flag], prog="yxanul tokenizer")
    sample, held = sample_and_held_out(cmd)
    assert sorted(sample + held) == want
