"""The ``checkpoint`` section of the config: where a run lives, what it resumes from, how often it saves
and how many checkpoints it keeps. Torch-free: ``yxanul.config`` reads it to parse flags and print ``--help``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

RUN_DIR_RESUMES = ("latest", "auto")  # resume values naming the run directory's own newest checkpoint


@dataclass
class CheckpointArgs:
    """Run directory and checkpoints."""

    output_dir: str | None = field(
        default=None,
        metadata={"help": "Run directory: config, checkpoints, metrics.jsonl, TensorBoard events and "
                          "samples all live under it (default: runs/<run_name>)."})
    run_name: str | None = field(default=None, metadata={"help": "Name of the run (default: <model>-<date>-<time>)."})
    resume: str | None = field(
        default=None,
        metadata={"help": "Resume from 'latest' (the newest checkpoint under output_dir; an error if it has none), "
                          "'auto' (resume if output_dir holds a checkpoint, else start fresh: for requeued jobs and "
                          "restarted pods) or a checkpoint path."})
    list_checkpoints: bool = field(default=False, metadata={"help": "Print the checkpoints of output_dir and exit."})
    checkpoint_freq: int = field(default=250,
                                 metadata={"help": "Save a checkpoint every N optimizer steps (0: only at the end)."})
    keep_last: int = field(default=3,
                           metadata={"help": "Keep the newest N checkpoints (the best by val loss is always kept)."})
    save_final: bool = field(default=True, metadata={"help": "Save a checkpoint when training ends."})
    resume_allow_changes: list[str] | None = field(
        default=None,
        metadata={"help": "Resume although these differ from what the checkpoint was trained on (else one line, "
                          "exit 2): tokenizer, dataset, val_split, seq_length, seed, or all. What each change does "
                          "to the run is printed."})

    def __post_init__(self):
        allowed = ("tokenizer", "dataset", "val_split", "seq_length", "seed", "all")
        bad = [n for n in self.resume_allow_changes or () if n not in allowed]
        if bad:
            raise ConfigError("resume_allow_changes", f"names out of {', '.join(allowed)}", bad[0])
        if self.run_name is not None and (not self.run_name.strip() or Path(self.run_name).is_absolute()
                                          or ".." in Path(self.run_name).parts):
            # it names folders inside the run (tensorboard/<run_name>) and runs/<run_name>: never one outside
            raise ConfigError("run_name", "a name, not an absolute path nor one with '..'", self.run_name)
        if self.checkpoint_freq < 0:
            raise ConfigError("checkpoint_freq", "an integer >= 0", self.checkpoint_freq)
        if self.keep_last < 1:
            raise ConfigError("keep_last", "an integer >= 1", self.keep_last)
