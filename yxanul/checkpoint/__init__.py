"""Checkpoints and the run directory, in the order a save goes through them: ``save`` (run directory,
``save_checkpoint``, pruning, which checkpoint a resume or ``init_from`` names), ``io`` (atomic writes,
accelerate's load for a resume), ``manifest`` (what a checkpoint holds, verified before use), ``pointers``
(``latest`` / ``best``) and ``table`` (`yxanul checkpoints`). The public names load lazily: ``yxanul.config``
reads ``CheckpointArgs`` without torch."""

from .._lazy import lazy_exports

_WHERE = {
    "CheckpointArgs": "save", "RUN_DIR_RESUMES": "save", "is_checkpoint_dir": "save",
    "latest_good_checkpoint": "save", "list_checkpoints": "save", "prepare_run_dir": "save", "read_state": "save",
    "resolve_resume": "save", "run_dir_of": "save", "save_checkpoint": "save", "verified_checkpoint": "save",
    "verified_weights_dir": "save", "load_for_resume": "io", "write_atomic": "io",
    "MANIFEST": "manifest", "STATE_FILE": "manifest", "checkpoint_bytes": "manifest", "has_manifest": "manifest",
    "read_manifest": "manifest", "verify_checkpoint": "manifest", "write_manifest": "manifest",
    "checkpoints_dir": "pointers", "read_pointer": "pointers", "recompute_best": "pointers",
    "format_table": "table",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
