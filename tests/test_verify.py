import json
import subprocess
import sys

import pytest
import torch

from yxanul import _te


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_verify_on_cpu():
    r = subprocess.run([sys.executable, "-m", "yxanul", "verify"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "no CUDA device" in r.stdout and "fp8 recipe delayed" in r.stdout
    r = subprocess.run([sys.executable, "-m", "yxanul", "verify", "--require_fp8", "--json"], capture_output=True, text=True)
    assert r.returncode == 1
    rows = json.loads(r.stdout)
    assert {row["check"] for row in rows if row["status"] == "FAIL"} >= {"gpu", "fp8 recipe delayed"}
    te_row = next(row for row in rows if row["check"] == "transformer_engine")
    assert te_row["status"] == ("PASS" if _te.TE_AVAILABLE else "FAIL")
