"""``import yxanul`` registers model type "yxanul" with transformers' Auto classes, without importing
transformers (``yxanul --help`` and one-line config errors must not pay for torch/transformers).

transformers' ``CONFIG_MAPPING`` only resolves its own model types lazily (it imports
``transformers.models.<type>``), so an outside package must hand it the class. The registration therefore
follows transformers instead of leading it:

- ``AutoConfig``: as soon as ``transformers.models.auto.configuration_auto`` has run (now, if the user
  imported transformers first; else through a one-name import hook on ``sys.meta_path``), ``YxanulConfig``
  goes into its ``CONFIG_MAPPING``. ``configuration_yxanul`` needs only ``PreTrainedConfig``, which
  configuration_auto has imported by then, so this costs no torch.
- ``AutoModel`` / ``AutoModelForCausalLM``: when the first ``YxanulConfig`` is built (``AutoConfig``
  loading a config.json, or user code), it imports ``modeling_yxanul`` by name, which registers its classes. Every
  Auto model lookup is keyed by a config instance's class, so no lookup can come earlier; the hook above
  cannot do it: transformers imports ``modeling_auto`` from inside ``modeling_layers``, which the model
  itself needs (a circular import at that moment).
"""

from __future__ import annotations

import sys
from importlib.abc import Loader, MetaPathFinder

CONFIG_AUTO = "transformers.models.auto.configuration_auto"


def register_config(configuration_auto) -> None:
    """Put ``YxanulConfig`` into ``configuration_auto.CONFIG_MAPPING`` (``AutoConfig.register``)."""
    try:
        from .models.configuration_yxanul import YxanulConfig  # transformers is loading: `import yxanul` stays light
    except ImportError:  # configuration_yxanul itself is importing transformers: it registers when it ends
        return
    configuration_auto.AutoConfig.register("yxanul", YxanulConfig, exist_ok=True)


class _RegisteringLoader(Loader):
    """The real loader of configuration_auto, then :func:`register_config` on the fresh module."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        register_config(module)

    def __getattr__(self, name):  # get_source, get_code, ...: the real loader's
        return getattr(self.loader, name)


class _ConfigAutoHook(MetaPathFinder):
    """Finds nothing itself: for configuration_auto it asks the other finders and wraps their loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname != CONFIG_AUTO:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Register now if transformers' configuration_auto is loaded, else when it gets imported."""
    module = sys.modules.get(CONFIG_AUTO)
    if module is not None and hasattr(module, "AutoConfig"):
        register_config(module)
    elif not any(isinstance(f, _ConfigAutoHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _ConfigAutoHook())
