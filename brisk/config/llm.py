"""Check model.llm.config against the transformers config class of its model_type.

transformers accepts any keyword into a config (a misspelt ``hidden_sizee=64`` is silently stored and never
used) and does not check types (``hidden_size="abc"`` fails later, deep in a layer). Both are config
mistakes, so they are reported here as one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import inspect
import json
from pathlib import Path

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:  # load.py calls these checks
    from .model import LLMConfig

# Accepted by the config classes and converted (not stored under their own name), e.g. rope_theta into
# rope_parameters in transformers 5.
LEGACY_KEYS = {"model_type", "rope_theta", "rope_scaling", "partial_rotary_factor", "torch_dtype", "num_labels"}


def _model_type(llm: LLMConfig) -> str | None:
    if "model_type" in llm.config:
        return llm.config["model_type"]
    if llm.path:
        f = Path(llm.path) / "config.json"
        if f.is_file():
            try:
                return json.loads(f.read_text(encoding="utf-8")).get("model_type")
            except ValueError:
                return None
    return None


def llm_config_tree(llm: LLMConfig) -> dict:
    """The decoder's config as a dict before the model is built: the folder's config.json (its text_config's
    keys where the top level lacks them), then the inline config over it."""
    tree = {}
    if llm.path:
        f = Path(llm.path) / "config.json"
        try:
            tree = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}
        except ValueError:
            tree = {}
        tree = {**tree.get("text_config", {}), **tree}
    return {**tree, **llm.config}


def linear_key_head_dims(llm: LLMConfig) -> list[int]:
    """The key head size of the model's Gated DeltaNet layers (``linear_key_head_dim``), read from the inline
    config, else the folder's config.json (or its text_config), else the config class's default; [] for a
    model without linear attention or when it cannot be told before the model is built."""
    tree = llm_config_tree(llm)
    if "linear_key_head_dim" in tree:
        return [int(tree["linear_key_head_dim"])]
    layer_types = tree.get("layer_types") or []
    model_type = tree.get("model_type")
    if model_type and (not layer_types or "linear_attention" in layer_types):
        from transformers import CONFIG_MAPPING

        if model_type in CONFIG_MAPPING:
            default = getattr(CONFIG_MAPPING[model_type](), "linear_key_head_dim", None)
            return [int(default)] if default else []
    return []


def _type_error(key: str, value, default) -> str | None:
    """What is wrong with ``value`` given the class default's type, or None."""
    if default is None or value is None:
        return None
    want = type(default)
    if want is bool:
        ok, what = isinstance(value, bool), "true or false"
    elif want is int:
        ok, what = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif want is float:
        ok, what = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    elif want is str:
        ok, what = isinstance(value, str), "a string"
    elif want in (list, tuple):
        ok, what = isinstance(value, (list, tuple)), "a list"
    elif want is dict:
        ok, what = isinstance(value, dict), "a mapping"
    else:
        return None
    return None if ok else f"model.llm.config.{key}={value!r}: expected {what} (like the default {default!r})"


def check_llm_config(llm: LLMConfig) -> None:
    if not llm.config:
        return
    model_type = _model_type(llm)
    if model_type is None:
        return  # build_llm says that a model_type is needed
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=1)
        raise ConfigError(f"model.llm.config.model_type={model_type!r}: not a transformers model type"
                          + (f"; did you mean {close[0]}?" if close else ""))
    cls = CONFIG_MAPPING[model_type]
    default = cls()
    defaults = default.to_dict()
    known = set(defaults) | LEGACY_KEYS | {k for c in cls.__mro__ if "__init__" in vars(c)
                                           for k in inspect.signature(c.__init__).parameters}
    known |= {k for k in llm.config if hasattr(default, k)}  # properties and aliases (attribute_map)
    for key, value in llm.config.items():
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            raise ConfigError(f"unknown key model.llm.config.{key}={value!r}: not a key of transformers' {cls.__name__} "
                              f"(model_type {model_type})" + (f"; did you mean {close[0]}?" if close else ""))
        problem = _type_error(key, value, defaults.get(key))
        if problem:
            raise ConfigError(problem)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0 and key.endswith(("_size", "_layers", "_heads")):
            raise ConfigError(f"model.llm.config.{key}={value}: must be positive")
