"""Driver for the DeepSpeed resume tests (test_yxanul_trainer.py on CPU, test_trainer_gpu.py on GPU), run
as ``accelerate launch --use_deepspeed --deepspeed_config_file ds_configs/zero1.json --num_processes 1
tests/integrations/ds_resume_driver.py DATA_DIR OUT [--gpu] [--plant]``.

YxanulTrainer under DeepSpeed ZeRO-1 trains 2 steps (``OUT/checkpoint-2``, with ``fp8_state.safetensors``
when FP8 ran), then a fresh model and trainer resume from it for one step. At the resumed run's
``on_train_begin`` (after DeepSpeed's loader and yxanul's FP8-state restore, before any step) the TE
scaling state is written to ``OUT/restored_fp8_state.safetensors``. ``--plant``: a CPU run has no FP8
state to save, so an FP8-shaped file is put into checkpoint-2 first (the file a GPU run would leave).
"""

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import TrainerCallback, TrainingArguments, set_seed

from yxanul import _te
from yxanul.data.hf_dataset import ShardWindowDataset
from yxanul.integrations import YxanulTrainer
from yxanul.models import ModelArgs, build_model
from yxanul.precision import PrecisionArgs
from yxanul.precision.state import FILE, fp8_state_dict

ROOT = Path(__file__).resolve().parents[2]
GPU = dict(preset="medium", seq=256, backend="te",
           precision=PrecisionArgs(use_fp8=True, require_fp8=True, fp8_recipe="delayed", fp8_margin=1,
                                   fp8_amax_history_len=16, fp8_min_gemm_dim=0))
CPU = dict(preset="nano", seq=32, backend="torch", precision=PrecisionArgs(use_fp8=True))
RESTORED = "restored_fp8_state.safetensors"


class DumpFP8State(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        save_file(fp8_state_dict(model), os.path.join(args.output_dir, RESTORED))


def run(data_dir, out, cfg, max_steps, seed, resume=None):
    set_seed(seed)
    model = build_model(ModelArgs(model=cfg["preset"], seq_length=cfg["seq"], backend=cfg["backend"]),
                        json.loads((Path(data_dir) / "meta.json").read_text())["vocab_size"])
    args = TrainingArguments(output_dir=out, max_steps=max_steps, per_device_train_batch_size=2, logging_steps=1,
                             save_strategy="steps", save_steps=2, report_to=[], disable_tqdm=True,
                             bf16=torch.cuda.is_available(), deepspeed=str(ROOT / "ds_configs" / "zero1.json"),
                             train_sampling_strategy="sequential", dataloader_num_workers=0)
    trainer = YxanulTrainer(model=model, args=args, train_dataset=ShardWindowDataset(data_dir, cfg["seq"], seed=0),
                            precision=cfg["precision"], callbacks=[DumpFP8State()] if resume else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def main(argv):
    data_dir, out = argv[0], argv[1]
    cfg = GPU if "--gpu" in argv else CPU
    run(data_dir, out, cfg, max_steps=2, seed=0)
    ckpt = os.path.join(out, "checkpoint-2")
    if "--plant" in argv:
        save_file({"model.layers.0.self_attention.layernorm_qkv.scaling_fwd.scale": torch.ones(3)},
                  os.path.join(ckpt, FILE))
    _te.reset_fp8_state()  # as the new process of a real resume would start: no TE amax buffers of run 1
    resumed = run(data_dir, out, cfg, max_steps=3, seed=1, resume=ckpt)
    print(f"resumed to step {resumed.state.global_step} under {type(resumed.model_wrapped).__name__}")


if __name__ == "__main__":
    main(sys.argv[1:])
