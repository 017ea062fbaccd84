"""Module swaps: how a switch changes what a module computes without patching it.

``swap_class(base, mixin)`` makes one subclass of ``(mixin, base)`` per pair, shared by every module it is used
on (Dynamo then compiles one graph for all of them). ``swapped(module, cls)`` returns a new instance of ``cls``
holding the very same parameters, buffers, children and settings as ``module``, with registries and hook
tables of its own (copies holding the same objects), so the state dict, the optimizer's parameters and
checkpoints are unchanged and hooks registered later on one do not reach the other. The caller puts it where
the module was (``setattr(parent, name, new)``, or a model API such as ``set_input_embeddings``); no instance
attribute of the old module is touched.
"""

from __future__ import annotations

import copy

from torch import nn

_CLASSES: dict[tuple[type, type], type] = {}


def swap_class(base: type, mixin: type, prefix: str | None = None) -> type:
    """The subclass (mixin, base), made once; its ``_swapped_from`` names ``base``."""
    key = (base, mixin)
    if key not in _CLASSES:
        name = f"{prefix or mixin.__name__}{base.__name__}"
        _CLASSES[key] = type(name, (mixin, base), {"_swapped_from": base, "__module__": mixin.__module__})
    return _CLASSES[key]


def swapped(module: nn.Module, cls: type) -> nn.Module:
    """A ``cls`` instance equal to ``module`` (same attribute values; its own registry dicts and hook tables)."""
    new = cls.__new__(cls)
    new.__dict__.update({k: copy.copy(v) if isinstance(v, (dict, set, list)) else v for k, v in module.__dict__.items()})
    return new
