"""The model: `YxanulConfig` + `YxanulForCausalLM`, registered with transformers' Auto classes."""

from transformers import AutoConfig, AutoModelForCausalLM

from .configuration_yxanul import PRESETS, YxanulConfig, config_from_preset, count_parameters, pad_vocab
from .modeling_yxanul import YxanulForCausalLM, resolve_backend

AutoConfig.register("yxanul", YxanulConfig, exist_ok=True)
AutoModelForCausalLM.register(YxanulConfig, YxanulForCausalLM, exist_ok=True)

__all__ = ["PRESETS", "YxanulConfig", "YxanulForCausalLM", "config_from_preset", "count_parameters",
           "pad_vocab", "resolve_backend"]
