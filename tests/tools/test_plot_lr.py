"""`yxanul plot-lr`: printed values equal lr_at, the PNG is real, YAML + flag precedence, curriculum."""

import re
from pathlib import Path

import pytest

from yxanul.errors import ConfigError, UserError
from yxanul.tools.plot_lr import main
from yxanul.training.schedule import lr_at


def _values(out):
    return {m[0].strip(): (int(m[1]), float(m[2]))
            for m in re.findall(r"^\s*(.+?): step\s+(\d+)\s+lr (\S+)$", out, re.M)}


def _png(path):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_flags_values_and_png(tmp_path, capsys):
    out = tmp_path / "lr.png"
    assert main(["--max_lr", "3e-3", "--min_lr_ratio", "0.1", "--warmup_steps", "200", "--max_steps", "1760",
                 "--out", str(out)]) == 0
    values = _values(capsys.readouterr().out)
    assert list(values) == ["start", "warmup end", "25%", "50%", "75%", "last"]
    kw = dict(max_lr=3e-3, min_lr_ratio=0.1, warmup_steps=200, decay_steps=1760)
    for name, (step, lr) in values.items():  # the trainer's step s runs at lr_at(s - 1)
        assert lr == pytest.approx(lr_at(step - 1, **kw), rel=1e-6), name
    assert values["warmup end"] == (201, 0.003) and values["50%"][0] == 880 and values["last"][0] == 1760
    assert _png(out)


def test_config_file_flags_override_and_curriculum(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_lr: 3e-3\nmin_lr_ratio: 0.2\nwarmup_steps: 20\nmax_steps: 100\nlr_decay_steps: 80\n"
                   "seq_length: 128\ntarget_tokens_per_step: 4096\nuse_wandb: false\ncurriculum:\n"
                   "  - {seq_length: 64, until_tokens: 200000}\n  - {seq_length: 128}\n")
    out = tmp_path / "lr.png"
    assert main(["--config", str(cfg), "--max_steps", "300", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    kw = dict(max_lr=3e-3, min_lr_ratio=0.2, warmup_steps=20, decay_steps=80)
    values = _values(text)
    assert values["last"][0] == 300 and values["last"][1] == pytest.approx(6e-4)  # flag won over the file
    for name, (step, lr) in values.items():
        assert lr == pytest.approx(lr_at(step - 1, **kw), rel=1e-6), name
    # 49 steps before stage 1 (ceil(200000 / 4096)): its first step is the trainer's step 50
    assert "stage 0: from step 1 seq_length 64 (after 0 tokens)" in text
    assert "stage 1: from step 50 seq_length 128 (after 200,704 tokens)" in text
    assert _png(out)


def test_errors(tmp_path):
    with pytest.raises(ConfigError, match="max_lr"):
        main(["--max_lr", "-1", "--out", str(tmp_path / "x.png")])
    with pytest.raises(UserError, match=r"unknown flag '--max_stepz' \(did you mean '--max_steps'\?\)"):
        main(["--max_stepz", "1"])  # the one CLI builder: one line, "did you mean"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("auto_batch_size: true\n"
                   "curriculum:\n  - {seq_length: 64, until_tokens: 1000}\n  - {seq_length: 128}\n")
    with pytest.raises(UserError, match="tokens per optimizer step"):
        main(["--config", str(cfg), "--out", str(tmp_path / "x.png")])
    cfg.write_text("max_lr: 3e-3\nwarmup_step: 20\n")  # a typo is no key of any config: not silently ignored
    with pytest.raises(ConfigError, match="warmup_step.*did you mean 'warmup_steps'"):
        main(["--config", str(cfg), "--out", str(tmp_path / "x.png")])


def test_warmup_in_tokens(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_lr: 1e-3\nwarmup_tokens: 100000\nmax_steps: 200\nseq_length: 128\n"
                   "target_tokens_per_step: 4096\n")
    assert main(["--config", str(cfg), "--out", str(tmp_path / "lr.png")]) == 0
    text = capsys.readouterr().out
    assert "warmup 100,000 tokens = 25 steps (4,096 tokens per optimizer step, rounded up)" in text  # 24.4 -> 25
    assert _values(text)["warmup end"] == (26, 1e-3)  # the first step at max_lr
    assert main(["--config", str(cfg), "--warmup_steps", "10", "--out", str(tmp_path / "lr.png")]) == 0
    assert _values(capsys.readouterr().out)["warmup end"] == (11, 1e-3)  # the flag replaces the file's tokens
    with pytest.raises(ConfigError, match=r"config key 'warmup_steps'.*warmup_tokens 100,000 = 25 steps"):
        main(["--warmup_steps", "10", "--warmup_tokens", "100000", "--tokens_per_step", "4096",
              "--out", str(tmp_path / "lr.png")])
    (tmp_path / "auto.yaml").write_text("auto_batch_size: true\n")  # tokens per step known only at run time
    with pytest.raises(ConfigError, match="config key 'warmup_tokens'.*tokens per optimizer step"):
        main(["--config", str(tmp_path / "auto.yaml"), "--warmup_tokens", "100000", "--out", str(tmp_path / "lr.png")])


def test_no_arguments_plot_what_yxanul_train_runs_and_say_where(tmp_path, capsys, monkeypatch):
    """`yxanul plot-lr` alone: the embedded default (300 steps, warmup 30, max_lr 2e-3) numbered like the
    trainer's step lines (last step 300), into runs/ (printed), never silently into the current directory;
    with --max_steps 20 the warmup adapts as in `yxanul train`."""
    from yxanul.config import DEFAULT_CONFIG, parse_args

    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    text = capsys.readouterr().out
    values = _values(text)
    kw = dict(max_lr=2e-3, min_lr_ratio=0.1, warmup_steps=30, decay_steps=300)  # yxanul/assets/default.yaml
    assert values["last"] == (300, pytest.approx(lr_at(299, **kw), rel=1e-6)) and values["warmup end"] == (31, 2e-3)
    assert text.rstrip().endswith(f"wrote {tmp_path / 'runs' / 'lr_schedule.png'}") and not list(tmp_path.glob("*.png"))
    assert _png(tmp_path / "runs" / "lr_schedule.png")
    assert main(["--max_steps", "20"]) == 0
    text = capsys.readouterr().out
    assert "warming up for 2 step(s) instead" in text and _values(text)["warmup end"] == (3, 2e-3)
    o = parse_args(["--config", DEFAULT_CONFIG, "--max_steps", "20"]).optim  # what the trainer runs
    assert _values(text)["last"][1] == pytest.approx(lr_at(19, max_lr=o.max_lr, min_lr_ratio=o.min_lr_ratio,
                                                               warmup_steps=o.warmup_steps, decay_steps=20))


def test_an_out_that_is_no_image_file_is_one_line_before_plotting(tmp_path):
    """A suffix matplotlib cannot write (.yaml: a traceback after the plot) or a folder (its .png was written next
    to it under another name); compare and plot-lr share the check, every format named is one matplotlib writes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from yxanul.tools.compare import main as compare_main
    from yxanul.tools.figures import FORMATS

    fig = plt.figure()
    assert set(FORMATS) <= set(fig.canvas.get_supported_filetypes())
    plt.close(fig)
    runs = [str(tmp_path), str(tmp_path)]
    for command, argv in ((main, ["--out", str(tmp_path / "lr.yaml")]), (main, ["--out", str(tmp_path)]),
                          (main, ["--tokens_per_step", "0"]),
                          (compare_main, [*runs, "--out", str(tmp_path / "c.txt")]),
                          (compare_main, [*runs, "--tolerance", "-1"])):
        with pytest.raises(ConfigError, match=r"config key '(out|tolerance|tokens_per_step)'"):
            command(argv)
    assert list(tmp_path.iterdir()) == []


def test_an_out_that_cannot_be_written_is_one_line(tmp_path, capsys):
    """compare and plot-lr write their figure through `save_figure`: a path under a file, or under /proc (a
    virtual filesystem), is one line naming the command's --out and the path, exit 2, not a traceback."""
    import json

    from yxanul.cli import main as cli

    (tmp_path / "file").write_text("x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "loss": 9.0 - s})
                                                              for s in range(1, 6)))
    outs = ([Path("/proc/yxanul-x/f.png")] if Path("/proc").is_dir() else []) + [tmp_path / "file" / "f.png"]
    for out in outs:
        run = str(tmp_path / "run")
        for argv, label in ((["plot-lr", "--max_steps", "20"], "plot-lr"), (["compare", run, run], "compare")):
            assert cli([*argv, "--out", str(out)]) == 2, (argv, out)
            err = capsys.readouterr().err.strip().splitlines()
            in_the_way = f"error: '{tmp_path / 'file'}': "  # the CLI's path line: names the file and the fix
            want = in_the_way if "file" in out.parts else f"error: {label} --out '{out}': cannot be written ("
            assert len(err) == 1 and err[0].startswith(want), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]
