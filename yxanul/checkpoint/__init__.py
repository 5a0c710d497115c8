"""Checkpoints and the run directory, in the order a save goes through them: ``args`` (``CheckpointArgs``),
``rundir`` (the run directory, settled and guarded before anything is built), ``resume`` (the checkpoints of
a run and which verified one a resume, ``init_from`` or a reader gets), ``save`` (``save_checkpoint``,
pruning, a full disk), ``io`` (atomic writes, accelerate's load for a resume), ``manifest`` (what a
checkpoint holds, verified before use), ``pointers`` (``latest`` / ``best``) and ``table``
(`yxanul checkpoints`). The public names load lazily: ``yxanul.config`` reads ``CheckpointArgs`` without
torch."""

from .._lazy import lazy_exports

_WHERE = {
    "CheckpointArgs": "args", "RUN_DIR_RESUMES": "args", "prepare_run_dir": "rundir", "run_dir_of": "rundir",
    "check_out_spares_runs": "rundir", "EarlierOutput": "rundir",
    "is_checkpoint_dir": "resume", "latest_good_checkpoint": "resume", "likely_resume": "resume",
    "list_checkpoints": "resume",
    "read_state": "resume", "resolve_resume": "resume", "verified_checkpoint": "resume",
    "verified_weights_dir": "resume", "save_checkpoint": "save", "left_behind": "save", "load_for_resume": "io",
    "saved_config": "io", "weights_mode_like": "io", "write_atomic": "io",
    "MANIFEST": "manifest", "STATE_FILE": "manifest", "checkpoint_bytes": "manifest", "has_manifest": "manifest",
    "read_manifest": "manifest", "verify_checkpoint": "manifest", "write_manifest": "manifest",
    "checkpoints_dir": "pointers", "read_pointer": "pointers", "recompute_best": "pointers",
    "format_table": "table", "listing": "table",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
