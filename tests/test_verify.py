"""`yxanul verify` on this machine: on CPU it reports FP8 unavailable and exits 0 unless --require_fp8."""

import json
import subprocess
import sys

import pytest
import torch

from yxanul import _te
from yxanul.tools.verify import main

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")


@cpu_only
def test_verify_on_cpu_exits_0(capsys, monkeypatch):
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    monkeypatch.setenv("NVTE_SOMETHING", "x")
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "[INFO] fp8 recipe delayed" in out
    assert "[WARN] env NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE" in out and "env NVTE_SOMETHING" in out
    assert "precision report for --model yxanul-0.6b" in out and "FP8 requested but off: no CUDA device" in out
    assert out.rstrip().endswith("all requirements met")


@cpu_only
def test_verify_require_fp8_json_exits_1(capsys):
    assert main(["--require_fp8", "--json", "--fp8_recipe", "current"]) == 1
    out = json.loads(capsys.readouterr().out)
    failed = {r["check"] for r in out["checks"] if r["status"] == "FAIL"}
    assert failed >= {"gpu", "fp8 recipe current", "fp8 in a yxanul-0.6b forward"}
    assert "fp8 recipe delayed" not in failed  # only the requested recipe is a requirement
    te_row = next(r for r in out["checks"] if r["check"] == "transformer_engine")
    assert te_row["status"] == ("PASS" if _te.TE_AVAILABLE else "FAIL")
    mlp = out["precision_report"]["layers"]["mlp"]
    assert mlp["fp8"] == 0 and mlp["bf16"] == 21 and mlp["why"] == out["precision_report"]["fallback_reason"]
    assert out["failed"] == len(failed)


def test_verify_unknown_model_is_a_config_error():
    from yxanul.errors import ConfigError

    with pytest.raises(ConfigError, match="model"):
        main(["--model", "nope"])


@cpu_only
def test_verify_cli_exit_codes():
    r = subprocess.run([sys.executable, "-m", "yxanul", "verify"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "yxanul", "verify", "--require_fp8"], capture_output=True, text=True)
    assert r.returncode == 1 and "failed" in r.stdout
