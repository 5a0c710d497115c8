"""`TrainArgs`: length and reproducibility of a run (the trainer's own config section)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError


@dataclass
class TrainArgs:
    """Length and reproducibility of the run."""

    max_steps: int = field(default=1000,
                           metadata={"help": "Optimizer steps to train for (total, including resumed ones)."})
    seed: int = field(default=1337, metadata={"help": "Seed for initialisation and data order."})
    torch_compile: bool = field(default=False, metadata={
        "help": "Compile the model with torch.compile (GPU: inductor, slower start, faster steps; CPU: the "
                "aot_eager backend, no speed-up)."})
    speed_defaults: bool = field(default=True, metadata={
        "help": "Set the speed flags measured to win for this backend and preset (yxanul/assets/speed_defaults.yaml, "
                "docs/benchmarks.md) where you did not set them; a launch that cannot run one keeps it off, a "
                "resume keeps the run's own values. Backend te only: CPU runs never change."})

    def __post_init__(self):
        if self.max_steps < 1:
            raise ConfigError("max_steps", "an integer >= 1", self.max_steps)
        if not 0 <= self.seed < 2**32:
            raise ConfigError("seed", "an integer in [0, 2**32)", self.seed)
