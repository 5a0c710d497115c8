"""FP8 scaling state in checkpoints without pickle.

TE stores DelayedScaling state (scales, amax history) as `_extra_state`: a pickled uint8 tensor
whose loading TE refuses unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 (unpickling runs code). yxanul
makes TE modules save an EMPTY extra state and writes the tensors themselves to
`fp8_state.safetensors`; on resume they are copied back after TE has created its FP8 metadata (one
no-grad forward under the recipe initialises it). Stateless recipes (current/block/MXFP8) have
nothing to save. Checkpoints therefore load anywhere: torch backend, BF16, or FP8.
"""

from __future__ import annotations

import torch

FILE = "fp8_state.safetensors"
_KEYS = ("scaling_fwd", "scaling_bwd")


def te_modules(model):
    for name, m in model.named_modules():
        if isinstance(getattr(m, "fp8_meta", None), dict):
            yield name, m


def strip_extra_state(model) -> None:
    """TE modules save an empty `_extra_state` and ignore an empty one on load."""
    for _, m in te_modules(model):
        orig_set = m.set_extra_state

        def set_extra_state(state, _orig=orig_set):
            if state is None or (torch.is_tensor(state) and state.numel() == 0):
                return None
            return _orig(state)

        m.get_extra_state = lambda: torch.empty(0, dtype=torch.uint8)
        m.set_extra_state = set_extra_state


def fp8_state_dict(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, m in te_modules(model):
        for key in _KEYS:
            st = m.fp8_meta.get(key)
            for attr in ("scale", "amax_history"):
                t = getattr(st, attr, None)
                if torch.is_tensor(t):
                    out[f"{name}.{key}.{attr}"] = t.detach().float().cpu().contiguous()
    return out


def load_fp8_state_dict(model, state: dict[str, torch.Tensor]) -> int:
    """Copy saved scales/amax histories into the (already initialised) FP8 metadata; returns count."""
    n = 0
    for name, m in te_modules(model):
        for key in _KEYS:
            st = m.fp8_meta.get(key)
            for attr in ("scale", "amax_history"):
                t, saved = getattr(st, attr, None), state.get(f"{name}.{key}.{attr}")
                if torch.is_tensor(t) and saved is not None and t.shape == saved.shape:
                    with torch.no_grad():
                        t.copy_(saved.to(t.device, t.dtype))
                    n += 1
    return n
