"""FP8 scaling state in checkpoints without pickle.

TE 2.20 (`module/base.py` get_extra_state/set_extra_state, `_extra_state.py`) stores
DelayedScaling state (recipe object, scale and amax history of forward and backward) as
`_extra_state`: a PICKLED uint8 tensor. `set_extra_state` classifies the pickle with pickletools and
refuses a delayed-scaling one ("can execute arbitrary code") unless
NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1; stateless recipes (current/block/MXFP8) and modules that
never ran FP8 save an empty tensor, which loads as a no-op.

Setting that variable around our own loads would re-enable unpickling for whatever file sits in the
run directory, so yxanul never pickles instead: TE modules save an EMPTY `_extra_state`
(`no_pickled_extra_state`, applied by the TE backend at construction), and the scale/amax tensors go
to `fp8_state.safetensors` next to the checkpoint (tensors only, nothing executable). On resume one
no-grad FP8 forward lets TE allocate its FP8 metadata for the configured recipe, then the saved
tensors are copied in (same shapes only). Checkpoints therefore load anywhere: torch backend, BF16,
FP8, with or without TE. A foreign checkpoint that does carry a pickle still reaches TE's own check.
"""

from __future__ import annotations

import torch

FILE = "fp8_state.safetensors"
_KEYS = ("scaling_fwd", "scaling_bwd")
_ATTRS = ("scale", "amax_history")


def te_modules(model):
    """(name, module) of every TE module (those with TE's `fp8_meta` dict)."""
    for name, m in model.named_modules():
        if isinstance(getattr(m, "fp8_meta", None), dict):
            yield name, m


def _empty_extra_state() -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def no_pickled_extra_state(root: torch.nn.Module) -> int:
    """TE modules under ``root`` save an empty `_extra_state` and ignore an empty one on load.
    Instance attributes are enough: torch's `_save_to_state_dict` / `_load_from_state_dict` call
    ``self.get_extra_state()`` / ``self.set_extra_state()``. Idempotent; returns modules changed."""
    n = 0
    for _, m in te_modules(root):
        if getattr(m, "_yx_no_pickle", False):
            continue
        orig_set = m.set_extra_state

        def set_extra_state(state, _orig=orig_set):
            if state is None or (torch.is_tensor(state) and state.numel() == 0):
                return None
            return _orig(state)  # a pickle from elsewhere: TE decides (refuses unless allowed)

        m.get_extra_state = _empty_extra_state
        m.set_extra_state = set_extra_state
        m._yx_no_pickle = True
        n += 1
    return n


def fp8_state_dict(model) -> dict[str, torch.Tensor]:
    """Delayed-scaling tensors of every TE module, as plain CPU fp32 tensors ({} when stateless)."""
    out = {}
    for name, m in te_modules(model):
        for key in _KEYS:
            st = m.fp8_meta.get(key)
            for attr in _ATTRS:
                t = getattr(st, attr, None)
                if torch.is_tensor(t):
                    out[f"{name}.{key}.{attr}"] = t.detach().float().cpu().contiguous()
    return out


def load_fp8_state_dict(model, state: dict[str, torch.Tensor]) -> int:
    """Copy saved scales/amax histories into the (already allocated) FP8 metadata; returns how many
    tensors were copied (a different recipe or history length copies nothing for that tensor)."""
    n = 0
    for name, m in te_modules(model):
        for key in _KEYS:
            st = m.fp8_meta.get(key)
            for attr in _ATTRS:
                t, saved = getattr(st, attr, None), state.get(f"{name}.{key}.{attr}")
                if torch.is_tensor(t) and saved is not None and t.shape == saved.shape:
                    with torch.no_grad():
                        t.copy_(saved.to(t.device, t.dtype))
                    n += 1
    return n
