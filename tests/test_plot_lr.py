import re
import subprocess
import sys

from yxanul.optim import lr_at


def test_plot_lr_values_and_png(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_lr: 0.003\nmin_lr_ratio: 0.1\nwarmup_steps: 200\nmax_steps: 1760\n"
                   "target_tokens_per_step: 1000\ncurriculum:\n  - {seq_length: 128, until_steps: 500}\n"
                   "  - {seq_length: 256}\n")
    out = tmp_path / "lr.png"
    r = subprocess.run([sys.executable, "-m", "yxanul", "plot-lr", "--config", str(cfg), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    values = {m[0].strip(): (int(m[1]), float(m[2])) for m in re.findall(r"^\s*(.+?): step\s+(\d+)\s+lr (\S+)$", r.stdout, re.M)}
    kw = dict(max_lr=0.003, min_lr_ratio=0.1, warmup_steps=200, decay_steps=1760)
    for name, (step, lr) in values.items():
        assert abs(lr - lr_at(step, **kw)) < 1e-9, name
    assert values["warmup end"] == (200, 0.003) and abs(values["last"][1] - 0.0003) < 1e-12
    assert "stage 1: from step 500" in r.stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
