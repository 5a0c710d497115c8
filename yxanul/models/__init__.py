"""The model: `YxanulConfig` + `YxanulForCausalLM`, registered with transformers' Auto classes.

`import yxanul.models` is enough for `AutoConfig` / `AutoModelForCausalLM` to know model_type "yxanul".
"""

from transformers import AutoConfig, AutoModelForCausalLM

from .args import ModelArgs, build_model, describe
from .configuration_yxanul import PRESETS, YxanulConfig, config_from_preset, count_parameters, matmul_parameters
from .configuration_yxanul import pad_vocab
from .modeling_yxanul import YxanulForCausalLM, YxanulModel, resolve_backend

AutoConfig.register("yxanul", YxanulConfig, exist_ok=True)
AutoModelForCausalLM.register(YxanulConfig, YxanulForCausalLM, exist_ok=True)

__all__ = ["PRESETS", "ModelArgs", "YxanulConfig", "YxanulForCausalLM", "YxanulModel", "build_model",
           "config_from_preset", "count_parameters", "describe", "matmul_parameters", "pad_vocab", "resolve_backend"]
