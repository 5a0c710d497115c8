"""`EvalTaskArgs`: benchmark tasks run at each evaluation during training (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

# tasks that ship with yxanul, by name
BUNDLED = {"cloze": Path(__file__).resolve().parents[1] / "assets" / "tasks" / "shakespeare_cloze.jsonl"}


@dataclass
class EvalTaskArgs:
    """Benchmark tasks during training."""

    eval_tasks: list[str] | None = field(default=None, metadata={
        "help": "Tasks scored at every evaluation, logged as <task>_acc in metrics.jsonl and eval/<task>_acc in the "
                "trackers: 'cloze' (the bundled Shakespeare cloze task), a HellaSwag-format .jsonl file (ctx, "
                "endings, label), or an lm-eval task name (hellaswag, arc_easy, piqa, ...: lm-eval's "
                "simple_evaluate on the model in memory)."})
    eval_task_dir: str | None = field(default=None, metadata={
        "help": "Folder of lm-eval task YAMLs for --eval_tasks names (lm-eval's include_path)."})
    eval_tasks_limit: int | None = field(default=200, metadata={
        "help": "At most this many examples per task at each evaluation (null: all)."})

    def __post_init__(self):
        if self.eval_tasks is not None:
            if isinstance(self.eval_tasks, str):
                self.eval_tasks = [self.eval_tasks]
            if not isinstance(self.eval_tasks, list) or not all(isinstance(t, str) and t for t in self.eval_tasks):
                raise ConfigError("eval_tasks", "a list of task names or .jsonl files", self.eval_tasks)
        if self.eval_task_dir is not None and (not isinstance(self.eval_task_dir, str) or not self.eval_task_dir):
            raise ConfigError("eval_task_dir", "a folder of lm-eval task YAMLs", self.eval_task_dir)
        if self.eval_tasks_limit is not None and (isinstance(self.eval_tasks_limit, bool)
                                                  or not isinstance(self.eval_tasks_limit, int)
                                                  or self.eval_tasks_limit < 1):
            raise ConfigError("eval_tasks_limit", "an integer >= 1 or null", self.eval_tasks_limit)
