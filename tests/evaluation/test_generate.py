"""`yxanul generate`: streams the model's own continuation from a run dir and from its Llama export."""

import pytest
import torch
from transformers import AutoTokenizer, TextStreamer

from yxanul.cli import main as cli
from yxanul.evaluation.generate import GenerateCommand, generate
from yxanul.hub.export import export

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


def test_generate_user_errors(tok_run, tmp_path, capsys):
    run, _ = tok_run
    assert cli(["generate", str(run), "--prompt", "a", "--prompt_file", "f"]) == 2
    assert cli(["generate", str(run), "--prompt_file", str(tmp_path / "missing.txt")]) == 2
    assert cli(["generate", str(run), "--top_p", "1.5"]) == 2
    assert cli(["generate", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(e.startswith("error: ") for e in err), err
    assert "top_p" in err[2] and "no such file" in err[3]
    bad = ["foo", "mps", f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"]
    for command, device in [(c, d) for c in ("generate", "eval") for d in bad]:  # before anything loads
        assert cli([command, str(run), "--device", device]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: config key 'device': expected auto, cpu or cuda[:N] ("), err


@pytest.mark.parametrize("flag", ["--max_new_tokens", "--temperature"])
def test_generate_rejects_negative(flag, tok_run):
    assert cli(["generate", str(tok_run[0]), flag, "-1"]) == 2
