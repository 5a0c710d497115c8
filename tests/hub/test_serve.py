"""The Llama export served by `transformers serve` (OpenAI-compatible HTTP, CPU, offline): one real
completion over HTTP equals the greedy continuation of the yxanul model."""

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from yxanul.hub.export import export

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn", "openai")),
    reason="transformers serve needs its serving extra (pip install yxanul[serve])")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_transformers_serve_completes_like_the_model(tok_run, prepared, tmp_path):
    from transformers import AutoTokenizer

    run, model = tok_run
    llama = export(run, tmp_path / "llama", dtype="fp32")
    tok = AutoTokenizer.from_pretrained(str(prepared / "tokenizer"))
    ids = tok("ROMEO:", return_tensors="pt").input_ids
    with torch.no_grad():
        want = tok.decode(model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)[0, ids.shape[1]:])
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(llama),
                               "--port", str(port), "--device", "cpu", "--dtype", "float32"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, "server did not start"
                time.sleep(1)
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"model": str(llama), "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0}).encode())
        body = json.loads(urllib.request.urlopen(req, timeout=120).read())
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 8
    assert body["choices"][0]["text"] == want
