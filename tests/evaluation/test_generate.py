"""`yxanul generate`: streams the model's own continuation from a run dir and from its Llama export."""

import json
import logging

import pytest
import torch
from hub.helpers import random_model, save_run
from transformers import AutoTokenizer, TextStreamer

from yxanul.cli import main as cli
from yxanul.evaluation.generate import GenerateCommand, generate
from yxanul.hub.export import export
from yxanul.hub.loading import load_model

PROMPT = "ROMEO:\nBut soft, what light"


class RecordingStreamer(TextStreamer):
    """transformers' TextStreamer (prints), also counting the chunks it was given."""

    chunks = 0

    def put(self, value):
        RecordingStreamer.chunks += 1
        super().put(value)


@pytest.mark.slow
def test_generate_streams_the_greedy_continuation(tok_run, prepared, tmp_path, capsys):
    run, model = tok_run
    tok = AutoTokenizer.from_pretrained(str(prepared / "tokenizer"))
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        want = tok.decode(model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)[0, ids.shape[1]:],
                          skip_special_tokens=True)
    RecordingStreamer.chunks = 0
    got = generate(GenerateCommand(model=str(run), prompt=PROMPT, max_new_tokens=6, temperature=0.0),
                   streamer_cls=RecordingStreamer)
    assert got == want and RecordingStreamer.chunks == 7  # the prompt, then one chunk per new token
    assert capsys.readouterr().out.rstrip("\n") == (PROMPT + want).rstrip("\n")
    llama = export(run, tmp_path / "llama", dtype="fp32")
    assert cli(["generate", str(llama), "--prompt", PROMPT, "--max_new_tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == (PROMPT + want).rstrip("\n")
    # sampling is seeded: the same seed gives the same text
    a = generate(GenerateCommand(model=str(llama), prompt=PROMPT, max_new_tokens=3, seed=3))
    b = generate(GenerateCommand(model=str(llama), prompt=PROMPT, max_new_tokens=3, seed=3))
    assert a == b


def test_sampling_reaches_generate_a_nucleus_of_one_token_is_greedy(tok_run, capsys):
    """--top_p and --top_k reach transformers' sampling: a nucleus (or top-k) of one token samples the greedy text
    whatever the seed; the same seed samples the same text."""
    run, _ = tok_run
    greedy = generate(GenerateCommand(model=str(run), prompt=PROMPT, max_new_tokens=6, temperature=0.0))
    for seed in (1, 2):
        assert generate(GenerateCommand(model=str(run), prompt=PROMPT, max_new_tokens=6, temperature=1.0,
                                        top_p=1e-6, seed=seed)) == greedy
        assert generate(GenerateCommand(model=str(run), prompt=PROMPT, max_new_tokens=6, temperature=1.0, top_k=1,
                                        seed=seed)) == greedy
    free = [generate(GenerateCommand(model=str(run), prompt=PROMPT, max_new_tokens=6, temperature=1.0, seed=s))
            for s in (1, 1, 2)]
    assert free[0] == free[1] and greedy not in free
    capsys.readouterr()


def test_generate_user_errors(tok_run, tmp_path, capsys):
    run, _ = tok_run
    assert cli(["generate", str(run), "--prompt", "a", "--prompt_file", "f"]) == 2
    assert cli(["generate", str(run), "--prompt_file", str(tmp_path / "missing.txt")]) == 2
    assert cli(["generate", str(run), "--top_p", "1.5"]) == 2
    assert cli(["generate", str(tmp_path / "nothing")]) == 2
    assert cli(["generate", str(run), "--top_p", "0"]) == 2  # an empty nucleus
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(e.startswith("error: ") for e in err), err
    assert "top_p" in err[2] and "no such file" in err[3] and "top_p" in err[4]
    bad = ["foo", "mps", f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"]
    for command, device in [(c, d) for c in ("generate", "eval") for d in bad]:  # before anything loads
        assert cli([command, str(run), "--device", device]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: config key 'device': expected auto, cpu or cuda[:N] ("), err


def test_generate_stops_at_the_positions_the_model_was_trained_on_and_says_so(tok_run, capsys):
    """A completion past max_position_embeddings would run the model where it never trained (and a huge
    max_new_tokens for minutes): capped, with one note; a prompt that fills them keeps its last tokens."""
    run, _ = tok_run
    from yxanul.hub.loading import load_model

    limit = int(load_model(str(run), "cpu")[0].config.max_position_embeddings)
    text = generate(GenerateCommand(model=str(run), prompt=PROMPT, max_new_tokens=10**8, temperature=0.0))
    out = capsys.readouterr()
    (note,) = out.err.strip().splitlines()
    assert note.startswith("note: generating ") and f"not {10**8}" in note and f"the {limit} positions" in note
    n = int(note.split()[2])
    assert 0 < n < limit and text == generate(GenerateCommand(model=str(run), prompt=PROMPT, max_new_tokens=n,
                                                              temperature=0.0))
    assert capsys.readouterr().err == ""  # within the positions: no note
    generate(GenerateCommand(model=str(run), prompt="a " * (2 * limit), max_new_tokens=3, temperature=0.0))
    assert f"generating 1 token, not 3, from the prompt's last {limit - 1} tokens" in capsys.readouterr().err


class Records(logging.Handler):
    """The messages of transformers' loggers, wherever its own handler prints them."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_log():
    records, logger = Records(), logging.getLogger("transformers")
    logger.addHandler(records)
    yield records.messages
    logger.removeHandler(records)


def test_a_prompt_past_the_positions_loses_its_start_and_the_note_says_so(tok_run, tmp_path, capsys,
                                                                           transformers_log):
    """A prompt of more tokens than the model has positions keeps its last ``limit - 1``: one note with the
    prompt's true length and what was dropped; stdout shows only the part the model read, then the completion;
    transformers' own too-long warning (an export's tokenizer ends where the model does) is not printed too."""
    run, model = tok_run
    llama = export(run, tmp_path / "llama", dtype="fp32")
    tok = AutoTokenizer.from_pretrained(str(llama))
    limit = tok.model_max_length
    prompt = "".join(f"{i} to {i + 1}, " for i in range(limit))
    ids = tok(prompt, verbose=False).input_ids
    n, kept = len(ids), ids[-(limit - 1):]
    with torch.no_grad():
        want = tok.decode(model.generate(torch.tensor([kept]), max_new_tokens=1, do_sample=False,
                                         pad_token_id=0)[0, -1:], skip_special_tokens=True)
    (tmp_path / "long.txt").write_text(prompt)
    assert cli(["generate", str(llama), "--prompt_file", str(tmp_path / "long.txt"), "--max_new_tokens", "300",
                "--temperature", "0"]) == 0
    out = capsys.readouterr()
    ours = [line for line in out.err.splitlines() if line and "Loading weights" not in line]  # transformers' bar
    assert ours == [
        f"note: the prompt has {n} tokens and the model {limit} positions: generating 1 token, not 300, from the "
        f"prompt's last {limit - 1} tokens (the first {n - limit + 1} are dropped, and not printed); "
        "a shorter prompt leaves room for more"], out.err
    assert out.out.rstrip("\n") == (tok.decode(kept) + want).rstrip("\n") and prompt.endswith(tok.decode(kept))
    assert not [m for m in transformers_log if "Token indices sequence length" in m], transformers_log
    # uncut, the tokenizer's warning is transformers' to give: a tokenizer that ends before the model does
    config = tmp_path / "llama" / "tokenizer_config.json"
    config.write_text(json.dumps(dict(json.loads(config.read_text()), model_max_length=8)))
    generate(GenerateCommand(model=str(llama), prompt="a " * 20, max_new_tokens=2, temperature=0.0))
    assert "note" not in capsys.readouterr().err
    assert [m for m in transformers_log if "Token indices sequence length" in m]


def test_generate_seed_and_prompt_file_errors_are_one_line(tok_run, tmp_path, capsys):
    run, _ = tok_run
    assert cli(["generate", str(run), "--seed", "-1"]) == 2
    assert cli(["generate", str(run), "--prompt_file", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: config key 'seed': expected an integer in [0, 2**32), got -1",
                   f"error: prompt_file '{tmp_path}': a folder, not a file"], err


@pytest.mark.parametrize("flag", ["--max_new_tokens", "--temperature"])
def test_generate_rejects_negative(flag, tok_run):
    assert cli(["generate", str(tok_run[0]), flag, "-1"]) == 2


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_generate_rejects_a_temperature_that_is_no_number(value, tmp_path, capsys):
    assert cli(["generate", str(tmp_path), "--temperature", value]) == 2  # before MODEL is even looked at
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: config key 'temperature': expected a finite number >= 0, got {float(value)!r}"], err


def test_generate_from_a_run_stops_at_end_of_text(prepared, tmp_path):
    """A checkpoint's config comes from its preset: the loader takes bos/eos from the run's tokenizer, so
    generate() stops at end-of-text as it does from an export. The final norm's weight at zero makes every logit
    0, and greedy decoding's argmax then picks id 0, the bundled tokenizer's <|endoftext|>."""
    model = random_model(2, False, 8192, seed=5)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    save_run(model, tmp_path / "run", te_views=False, data_dir=prepared)
    loaded, tok = load_model(tmp_path / "run")
    assert tok.eos_token_id == 0
    for ids in (loaded.config, loaded.generation_config):
        assert (ids.eos_token_id, ids.bos_token_id) == (tok.eos_token_id, tok.bos_token_id)
    RecordingStreamer.chunks = 0
    got = generate(GenerateCommand(model=str(tmp_path / "run"), prompt=PROMPT, max_new_tokens=8, temperature=0.0,
                                   device="cpu"), streamer_cls=RecordingStreamer)
    assert got == "" and RecordingStreamer.chunks == 2  # the prompt, then end-of-text: no 7 more
