"""`yxanul plan`: the table, --json, the choice, the launch line and one-line user errors."""

import json

import pytest

from yxanul.cli import main
from yxanul.models import config_from_preset
from yxanul.planning.cli import PROFILES, PlanCommand, launch_line, plan
from yxanul.planning.memory import STRATEGIES, memory, model_shapes

GiB = 2**30
GPT2 = ("--vocab_size", "50257")  # the numbers below are for GPT-2's vocabulary (the default is the run's tokenizer's)


def run_json(capsys, *argv):
    code = main(["plan", *GPT2, *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_7b_on_two_nodes_picks_the_least_sharded_strategy_that_fits(capsys):
    code, p = run_json(capsys, "--preset", "7b", "--seq_length", "4096", "--gpus", "8", "--nodes", "2",
                       "--gpu_memory", "80")
    assert code == 0 and p["params"] == 7_185_633_280
    rows = {(r["strategy"], r["checkpointing"]): r for r in p["rows"]}
    assert not rows[("ddp", False)]["fits"] and not rows[("ddp", True)]["fits"]  # 16 B/param + buckets > 80 GiB
    assert rows[("zero1", False)]["fits"]
    assert p["choice"]["strategy"] == "zero1" and p["choice"]["checkpointing"] is False
    line = p["choice"]["launch"]
    assert line.startswith("accelerate launch --config_file accelerate_configs/deepspeed_zero1_fp8.yaml")
    for part in ("--num_machines 2", "--num_processes 16", "--machine_rank $NODE_RANK", "--model 7b",
                 "--seq_length 4096", "--micro_batch_size 1"):
        assert part in line
    # sharding strictly lowers the model state per GPU, in the planner's order
    state = [rows[(s, False)]["weights"] + rows[(s, False)]["gradients"] + rows[(s, False)]["optimizer"]
             for s in ("ddp", "zero1", "zero2", "fsdp2")]
    assert state == sorted(state, reverse=True)


def test_tight_memory_needs_sharding_and_checkpointing(capsys):
    code, p = run_json(capsys, "--preset", "7b", "--seq_length", "4096", "--micro_batch_size", "4", "--gpus", "8",
                       "--nodes", "2", "--gpu_memory", "40")
    assert code == 0
    c = p["choice"]
    # ZeRO-2 does not fit even with checkpointing; HSDP (shard in a node, replicate across) is next
    assert c["checkpointing"] and c["strategy"] == "hsdp"
    assert "--gradient_checkpointing true" in c["launch"]
    fits = [r for r in p["rows"] if r["fits"]]
    assert all(r["total"] <= p["budget_bytes"] for r in fits)
    first = next(r for r in p["rows"] if r["fits"])
    assert (first["strategy"], first["checkpointing"]) == (c["strategy"], c["checkpointing"])
    for part in ("--config_file accelerate_configs/fsdp2_hsdp.yaml", "--num_machines 2", "--num_processes 16",
                 "--parallelism_config_dp_replicate_size 2 --parallelism_config_dp_shard_size 8"):
        assert part in c["launch"], c["launch"]


def test_hsdp_only_across_nodes_and_single_for_one_gpu(capsys):
    _, one = run_json(capsys, "--preset", "3b", "--gpus", "8")
    assert "hsdp" not in {r["strategy"] for r in one["rows"]}
    _, single = run_json(capsys, "--preset", "nano", "--gpus", "1", "--gpu_memory", "16")
    assert single["choice"]["strategy"] == "single"
    assert single["choice"]["launch"].startswith(  # BF16: the profile's fp8 overridden (accelerate refuses it sans TE)
        "accelerate launch --config_file accelerate_configs/single_gpu_fp8.yaml --mixed_precision bf16 train.py")
    _, fp8 = run_json(capsys, "--preset", "nano", "--gpus", "1", "--gpu_memory", "16", "--use_fp8", "true")
    assert fp8["choice"]["launch"].startswith("accelerate launch --config_file accelerate_configs/single_gpu_fp8.yaml "
                                              "train.py") and "--use_fp8 true" in fp8["choice"]["launch"]
    zero = launch_line(PlanCommand(preset="7b", gpus=8, vocab_size=50257), "zero3", True)
    assert "--mixed_precision" not in zero  # DeepSpeed's profiles leave the precision to the yxanul config
    _, ddp = run_json(capsys, "--preset", "nano", "--gpus", "4", "--gpu_memory", "16")  # fits whole: DDP
    assert ddp["choice"]["strategy"] == "ddp"
    assert ddp["choice"]["launch"].startswith("accelerate launch --config_file accelerate_configs/multi_gpu_fp8.yaml "
                                              "--mixed_precision bf16 --num_machines 1 --num_processes 4 train.py")


def test_max_micro_batch_is_the_largest_that_fits():
    a = PlanCommand(preset="3b", seq_length=2048, gpus=8, nodes=1, gpu_memory=80, vocab_size=50257)
    p = plan(a)
    c = config_from_preset("3b", 50257, 2048, backend="torch")
    s = model_shapes(c)
    for r in p["rows"]:
        m = r["max_micro_batch"]
        def at(b, r=r):
            return memory(r["strategy"], c, s, micro=b, seq_length=2048, checkpointing=r["checkpointing"],
                          world=8, gpus_per_node=8, backend=p["backend"], loss_impl=p["loss_impl"]).total
        assert m == 0 or at(m) <= a.budget
        assert at(m + 1) > a.budget


def test_table_output_names_every_strategy(capsys):
    assert main(["plan", *GPT2, "--preset", "3b", "--seq_length", "2048", "--gpus", "8", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    for s in STRATEGIES[1:]:
        assert f" {s} " in out
    assert "fastest that fits:" in out and "accelerate launch" in out


def test_nothing_fits_exits_1_with_the_one_line_table_advice(capsys):
    assert main(["plan", *GPT2, "--preset", "7b", "--gpus", "1", "--gpu_memory", "24"]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == ("nothing fits (any strategy, with or without activation checkpointing); each of these alone "
                    "would: --gpus 8 | --gpu_memory 138.2"), last  # micro-batch 1 already: no smaller one advised
    for fewer in (["--gpus", "4"], ["--gpu_memory", "138.1"]):  # the least that fits
        assert main(["plan", *GPT2, "--preset", "7b", "--gpus", "1", "--gpu_memory", "24", *fewer]) == 1, fewer


@pytest.mark.parametrize("argv, advised", [
    (["--preset", "7b", "--gpus", "1", "--gpu_memory", "24"], ["--gpus 8", "--gpu_memory 138.2"]),
    (["--preset", "medium", "--gpus", "1", "--gpu_memory", "40", "--micro_batch_size", "64"],
     ["--micro_batch_size 57", "--seq_length 1024", "--gpus 2", "--gpu_memory 43.3"]),
    (["--preset", "xlarge", "--gpus", "1", "--gpu_memory", "32", "--master_weights", "fp32", "--use_fp8"],
     ["--master_weights none", "--gpus 2 --master_weights none", "--gpu_memory 33.6"]),
    (["--preset", "7b", "--gpus", "8", "--gpu_memory", "16", "--seq_length", "8192", "--micro_batch_size", "4"],
     ["--gpu_memory 48.5"]),  # activations do not shard: no number of GPUs, no halved sequence fits at micro 4
])
def test_nothing_fits_advises_only_changes_that_fit(capsys, argv, advised):
    """Each advised change, alone, makes the same plan fit: the planner's own memory model checked it; checkpointing
    and the strategies are the table's rows already, so they are never advised."""
    code, p = run_json(capsys, *argv)
    assert code == 1 and p["choice"] is None and p["advice"] == advised
    for change in advised:
        assert main(["plan", *GPT2, *argv, *change.split()]) == 0, change  # the later flag wins
        capsys.readouterr()


@pytest.mark.parametrize("argv,key", [
    (["--preset", "13b"], "preset"), (["--gpus", "0"], "gpus"), (["--gpu_memory", "-1"], "gpu_memory"),
    (["--gpu_memory", "inf"], "gpu_memory"),
    (["--headroom", "1.5"], "headroom"), (["--seq_lenght", "4"], "seq_length"),
    (["--backend", "torch", "--use_fp8"], "use_fp8"), (["--backend", "torch", "--loss_impl", "te"], "loss_impl"),
    (["--master_weights", "fp32"], "master_weights"),  # 8 GPUs: DDP/DeepSpeed/FSDP2 keep their own masters
])
def test_user_errors_are_one_line(capsys, argv, key):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and "Traceback" not in err


def test_the_config_of_the_launch_line_is_read_as_train_reads_it(capsys, tmp_path):
    """A --config that train would refuse (missing, a folder, not a mapping) is one line, exit 2, as find-batch and
    train say it, not a launch line that fails later; a good one is named in the line, none leaves the placeholder."""
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n")
    for path, why in ((tmp_path / "none.yaml", "no such file"), (tmp_path, "a folder, not a YAML file"),
                      (listed, "expected a mapping")):
        assert main(["plan", "--preset", "nano", "--gpus", "1", "--config", str(path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith(f"error: config file '{path}': {why}"), captured
        assert captured.err.count("\n") == 1
    good = tmp_path / "run.yaml"
    good.write_text("max_steps: 10\n")
    assert run_json(capsys, "--preset", "nano", "--gpus", "1", "--config", str(good))[1]["choice"]["launch"].count(
        f" --config {good} ") == 1
    assert " --config CONFIG.yaml " in run_json(capsys, "--preset", "nano", "--gpus", "1")[1]["choice"]["launch"]


def test_the_plan_is_of_the_run_its_config_describes_and_flags_win(capsys, tmp_path):
    """`yxanul plan --config run.yaml` plans the run train would start from that file (its model, seq_length,
    micro-batch, backend, FP8, loss, master weights), not the plan's defaults (7b, 2048, BF16); a flag wins."""
    run = tmp_path / "run.yaml"
    run.write_text("model: small\nseq_length: 512\nmicro_batch_size: 4\nbackend: auto\nuse_fp8: true\n"
                   "loss_impl: chunked\nmaster_weights: fp32\n")
    p = run_json(capsys, "--gpus", "1", "--config", str(run))[1]
    got = {k: p[k] for k in ("preset", "seq_length", "micro_batch_size", "backend", "fp8", "loss_impl",
                             "master_weights")}
    assert got == {"preset": "small", "seq_length": 512, "micro_batch_size": 4, "backend": "te", "fp8": True,
                   "loss_impl": "chunked", "master_weights": "fp32"}
    assert " --model small --seq_length 512 --micro_batch_size 4 " in p["choice"]["launch"]
    p = run_json(capsys, "--gpus", "1", "--config", str(run), "--model", "nano", "--seq_length", "256",
                 "--use_fp8", "false")[1]
    assert (p["preset"], p["seq_length"], p["fp8"], p["micro_batch_size"]) == ("nano", 256, False, 4)
    # the file's master weights on 8 GPUs: the plan's own one-line refusal, as with the flag
    assert main(["plan", "--gpus", "8", "--config", str(run)]) == 2
    assert "master_weights" in capsys.readouterr().err


def test_the_vocabulary_is_the_one_train_would_use(capsys, tmp_path):
    """Unset, --vocab_size follows the run: the bundled 8k BPE (train's default: nano is the 5.05M-parameter model
    train builds, not GPT-2's 0.02B), the --config's tokenizer (its largest id + 1, as prepare records it), a
    data_dir given alone (its meta.json), and the flag over all of them; a tokenizer train could not load is one
    line, exit 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    def vocab(*argv):
        assert main(["plan", "--preset", "nano", "--seq_length", "32", "--gpus", "2", "--gpu_memory", "3",
                     "--backend", "torch", *argv, "--json"]) == 0
        p = json.loads(capsys.readouterr().out)
        assert p["params"] == model_shapes(config_from_preset("nano", p["vocab_size"], 32, backend="torch")).params
        return p["vocab_size"], p["params"]

    assert vocab() == (8192, 5_048_576)  # what train builds with no tokenizer set
    raw = Tokenizer(models.WordLevel({"<eos>": 0, "<unk>": 1, "a": 2, "b": 70_000}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", unk_token="<unk>").save_pretrained(tmp_path / "t")
    run = tmp_path / "run.yaml"
    run.write_text(f"tokenizer: {tmp_path / 't'}\ndata_dir: {tmp_path / 'd'}\n")
    assert vocab("--config", str(run))[0] == 70_001
    assert vocab("--config", str(run), "--vocab_size", "50257")[0] == 50257
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "meta.json").write_text(json.dumps({"vocab_size": 1234}))
    run.write_text(f"data_dir: {tmp_path / 'd'}\n")
    assert vocab("--config", str(run))[0] == 1234
    run.write_text(f"tokenizer: {tmp_path / 'none'}\n")
    assert main(["plan", "--preset", "nano", "--config", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: tokenizer '{tmp_path / 'none'}': no such folder"), err
    assert main(["plan", "--preset", "nano", "--seq_length", "32", "--gpus", "2", "--gpu_memory", "3",
                 "--backend", "torch"]) == 0
    line = capsys.readouterr().out.splitlines()[0]  # a small model's FLOPs are no "0.0 GFLOPs/token"
    assert line.startswith("nano: 5.05M parameters (vocabulary 8192), 0.0") and " 0.0 GFLOPs" not in line, line


def test_every_launchable_strategy_has_a_shipped_profile():
    from pathlib import Path

    assert set(PROFILES) == set(STRATEGIES)  # FSDP2 and HSDP too (accelerate_configs/fsdp2*.yaml)
    shipped = Path(__file__).resolve().parents[2] / "accelerate_configs"
    assert all((shipped / f).is_file() for f in PROFILES.values()), PROFILES


def test_docs_example_is_the_real_output(capsys):
    """docs/distributed.md "Planning memory" shows this command's output: keep it honest."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "distributed.md").read_text()
    cmd = "$ yxanul plan --preset 7b --seq_length 4096 --gpus 8 --nodes 2 --gpu_memory 80 --vocab_size 50257\n"
    shown = doc.split(cmd, 1)[1].split("```", 1)[0]
    assert main(cmd.split()[2:]) == 0
    assert capsys.readouterr().out == shown


def test_the_run_s_backend_precision_and_loss_change_the_activations(capsys):
    """TE's blocks keep less than the torch twin, FP8 less than BF16, TE's loss and the chunked one less than the
    fp32 log-softmax; a preset's loss comes from the speed-defaults table unless given, and the launch line
    carries what the plan assumed."""
    def single(*argv):
        code, p = run_json(capsys, "--preset", "medium", "--seq_length", "1024", "--micro_batch_size", "16",
                           "--gpus", "1", "--gpu_memory", "139", *argv)
        assert code == 0
        return p, next(r for r in p["rows"] if not r["checkpointing"])

    table, r_table = single()  # te/medium's entry: --loss_impl te
    assert (table["backend"], table["fp8"], table["loss_impl"]) == ("te", False, "te")
    assert "--loss_impl" not in table["choice"]["launch"]  # the run takes it from the same table
    _, te_default = single("--loss_impl", "default")
    _, torch_default = single("--backend", "torch", "--loss_impl", "default")
    _, fp8 = single("--loss_impl", "default", "--use_fp8")
    _, chunked = single("--loss_impl", "chunked")
    assert torch_default["activations"] > te_default["activations"] > fp8["activations"]
    assert te_default["activations"] > r_table["activations"] > chunked["activations"]
    c = config_from_preset("medium", 50257, 1024)
    n, layers, ffn = 16 * 1024, c.num_hidden_layers, c.intermediate_size
    assert te_default["activations"] - fp8["activations"] == layers * ffn * n  # the SwiGLU output in FP8
    assert te_default["activations"] - r_table["activations"] == 8 * c.vocab_size * n  # 12V -> 4V
    p, masters = single("--loss_impl", "default", "--use_fp8", "--master_weights", "fp32")
    assert masters["weights"] == fp8["weights"] // 2 and masters["total"] > fp8["total"]  # + FP8 copies of BF16
    assert p["choice"]["launch"].endswith("--use_fp8 true --loss_impl default --master_weights fp32")
