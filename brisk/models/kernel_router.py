"""transformers' hub-kernel router, taken off the modules brisk builds.

With the ``kernels`` package installed (transformers >= 5.25 requires it), transformers wraps the forward of some
module classes (Qwen3's attention: ``@use_kernelized_func(apply_rotary_pos_emb)``) in a router that, on every
call, writes the model's kernel table into a process-global context variable and resets it afterwards. brisk loads
no hub kernels (nothing is downloaded at run time), so the router only ever selects the functions the model
defines itself, but its global write is a side effect inside every compiled layer:

- inside an activation-checkpointed layer Dynamo refuses side effects (a graph break: the layer is not compiled);
- the first compiled call flips the variable to its "global" mode, which the first graph guards on: every compiled
  function recompiles once, and the second compile can fall inside a CUDA graph capture.

``without_kernel_router`` swaps each such module for a subclass whose forward is the class's own (the one the
router wraps): same parameters, same state dict, same computation (with no kernel selected, the router calls the
model's functions as they are)."""

from __future__ import annotations

from torch import nn

from ..swap import swapped

_PLAIN: dict[type, type] = {}


def _routed_forward(cls: type):
    """The forward the router wraps, or None where the class's forward is not the router (``functools.wraps`` copies
    the wrapped function's name and module, so the router is known by its code)."""
    forward = cls.__dict__.get("forward")
    inner, code = getattr(forward, "__wrapped__", None), getattr(forward, "__code__", None)
    if inner is None or code is None or code.co_name != "new_forward" or "kernels" not in code.co_filename:
        return None
    return inner


def _plain_class(cls: type) -> type:
    if cls not in _PLAIN:
        _PLAIN[cls] = type(cls.__name__, (cls,), {"forward": _routed_forward(cls), "_swapped_from": cls,
                                                  "__module__": cls.__module__})
    return _PLAIN[cls]


def without_kernel_router(model: nn.Module) -> int:
    """Swap every module whose class forward is the hub-kernel router's for one running the class's own forward;
    returns how many were swapped (0 without the ``kernels`` package)."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if _routed_forward(type(child)) is not None]
    for parent, name, child in swaps:
        setattr(parent, name, swapped(child, _plain_class(type(child))))
    return len(swaps)
