"""The model: `YxanulConfig` + `YxanulForCausalLM`, registered with transformers' Auto classes.

Exports load lazily (``yxanul._lazy``): ``ModelArgs`` and the presets come without torch. Importing
the config or model classes (``from yxanul.models import YxanulForCausalLM``) registers model_type
"yxanul" with ``AutoConfig`` / ``AutoModelForCausalLM``; so does ``import yxanul.models.modeling_yxanul``.
"""

from .._lazy import lazy_exports

_WHERE = {
    "ModelArgs": "args", "build_model": "build", "describe": "build", "load_weights": "build",
    "BACKENDS": "presets", "PRESETS": "presets",
    "YxanulConfig": "configuration_yxanul", "config_from_preset": "configuration_yxanul",
    "count_parameters": "configuration_yxanul", "matmul_parameters": "configuration_yxanul",
    "pad_vocab": "configuration_yxanul",
    "YxanulForCausalLM": "modeling_yxanul", "YxanulModel": "modeling_yxanul", "resolve_backend": "modeling_yxanul",
    "LORA_TARGET_PARAMETERS": "modeling_yxanul",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
