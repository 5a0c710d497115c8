"""`yxanul generate MODEL [--prompt TEXT | --prompt_file F] [--max_new_tokens N] [--temperature T] ...`.

MODEL: a run directory (its best, else latest checkpoint), a checkpoint folder, or an export (Llama or
yxanul format). Text streams to the terminal through transformers' ``TextStreamer`` as it is generated;
``model.generate`` runs with ``use_cache=True`` (a KV cache wherever the model has one). Checkpoints of
either backend (TE or torch) load into the torch backend, on CPU or GPU.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ConfigError, DataError, UserError
from ..flags import parse_command
from ..hub.loading import device_of, load_model


@dataclass
class GenerateCommand:
    """Generate text from a run, checkpoint or export, streamed to the terminal."""

    model: str = field(metadata={"positional": True, "help": "Run directory, checkpoint folder or export folder."})
    prompt: str | None = field(default=None, metadata={"help": "Prompt text (default: start from end-of-text)."})
    prompt_file: str | None = field(default=None, metadata={"help": "Read the prompt from this file."})
    max_new_tokens: int = field(default=100, metadata={"help": "Tokens to generate."})
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature (0: greedy decoding)."})
    top_k: int | None = field(default=50, metadata={"help": "Sample among the k most likely tokens (null: all)."})
    top_p: float | None = field(default=None, metadata={"help": "Nucleus sampling: smallest set with this mass."})
    seed: int = field(default=0, metadata={"help": "Random seed of the sampling."})
    device: str = field(default="auto", metadata={"help": "auto (cuda if available), cpu or cuda[:N]."})

    def __post_init__(self):
        if self.prompt is not None and self.prompt_file is not None:
            raise ConfigError("prompt", "either --prompt or --prompt_file, not both", "both")
        if self.max_new_tokens < 1:
            raise ConfigError("max_new_tokens", "an integer >= 1", self.max_new_tokens)
        if not math.isfinite(self.temperature) or self.temperature < 0:  # nan < 0 is False
            raise ConfigError("temperature", "a finite number >= 0", self.temperature)
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError("top_k", "an integer >= 1 or null", self.top_k)
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError("top_p", "a number in (0, 1] or null", self.top_p)
        if not 0 <= self.seed < 2**32:  # numpy's seed range, which transformers' set_seed feeds
            raise ConfigError("seed", "an integer in [0, 2**32)", self.seed)
        device_of(self.device)


def prompt_text(a: GenerateCommand) -> str:
    if a.prompt_file is None:
        return a.prompt or ""
    p = Path(a.prompt_file)
    if not p.is_file():
        raise DataError(f"prompt_file '{a.prompt_file}': " + ("a folder, not a file" if p.is_dir() else "no such file"))
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"prompt_file '{a.prompt_file}': not UTF-8 text") from None


def _encode(tok, text: str, limit: int) -> tuple[torch.Tensor, str, int]:
    """(ids the model reads, the text they cover, the prompt's token count): a prompt of ``limit`` tokens or more
    keeps its last ``limit - 1``, room for one new token. transformers' too-long warning is left to the case
    yxanul does not cut, where no note of ours replaces it."""
    if not text:
        return torch.tensor([[tok.eos_token_id]]), "", 1
    enc = tok(text, return_offsets_mapping=bool(tok.is_fast), verbose=False)
    ids, n = enc.input_ids, len(enc.input_ids)
    if n < limit:
        if n > tok.model_max_length:
            tok(text, verbose=True)
        return torch.tensor([ids]), text, n
    kept = ids[-(limit - 1):]
    shown = text[enc.offset_mapping[-(limit - 1)][0]:] if tok.is_fast else tok.decode(kept)
    return torch.tensor([kept]), shown, n


def _note(n: int, kept: int, new: int, a: GenerateCommand, limit: int) -> str | None:
    """One line where the prompt was cut or the completion capped; None where neither."""
    if n > kept:  # past its positions a model has never been trained: the prompt loses its start
        room = f"{new} token{'s' if new != 1 else ''}, not {a.max_new_tokens}, " if new < a.max_new_tokens else ""
        return (f"note: the prompt has {n} tokens and the model {limit} positions: generating {room}from the "
                f"prompt's last {kept} tokens (the first {n - kept} are dropped, and not printed); "
                f"a shorter prompt leaves room for more")
    if new < a.max_new_tokens:  # a huge max_new_tokens would otherwise run for minutes where it never trained
        return (f"note: generating {new} tokens, not {a.max_new_tokens}: the prompt ({n} tokens) and the "
                f"completion fill the {limit} positions the model was trained on")
    return None


def generate(a: GenerateCommand, streamer_cls=None) -> str:
    """Stream the completion to stdout, after the part of the prompt the model reads; returns the generated
    text (without the prompt)."""
    from transformers import TextStreamer, set_seed

    text = prompt_text(a)
    device = device_of(a.device)
    model, tok = load_model(a.model, device)
    if tok is None:
        raise UserError(f"MODEL '{a.model}': no tokenizer found (export the run with its prepared data present)")
    limit = int(model.config.max_position_embeddings)
    ids, shown, n = _encode(tok, text, limit)
    ids = ids.to(device)   # (1, T)
    new = min(a.max_new_tokens, limit - ids.shape[1])
    note = _note(n, ids.shape[1], new, a, limit)
    if note:
        print(note, file=sys.stderr, flush=True)
    set_seed(a.seed)
    streamer = (streamer_cls or TextStreamer)(tok, skip_prompt=True, skip_special_tokens=True)
    print(shown, end="", flush=True)
    sampling = dict(do_sample=True, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p) \
        if a.temperature > 0 else dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             streamer=streamer, use_cache=True, pad_token_id=tok.eos_token_id, **sampling)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    generate(parse_command(GenerateCommand, argv, prog="yxanul generate"))
    return 0
