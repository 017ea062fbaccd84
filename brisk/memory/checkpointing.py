"""model.llm.activation_checkpoint and model.encoder.activation_checkpoint: recompute layers in the backward.

FunASR 1.4.16 names the switches ``llm_conf.activation_checkpoint`` (transformers'
``gradient_checkpointing_enable()``: every decoder layer) and ``audio_encoder_conf.activation_checkpoint``
(the whole encoder under one ``torch.utils.checkpoint``). Here both are per layer, every k-th one
(k=1: all; FunASR's ``true``), so memory can be traded for time in steps.

A checkpointed layer is a new module that holds the original layer's own submodules, parameters and buffers
under the same names (its class is a subclass of the layer's class, so ``isinstance`` checks and attribute
reads still work) and swaps in for it in the parent's list. torch's ``checkpoint_wrapper`` would hold the
layer as a child named ``_checkpoint_wrapped_module``, which changes every state-dict key under it; here
the state dict, the optimizer's parameters and checkpoint files are the same with the switch on or off.

The recomputation runs the layer's own forward again (non-reentrant ``torch.utils.checkpoint``; when the layer
has active dropout the RNG state is restored, so dropout draws the same mask): the loss and the gradients are
the same numbers as without it.
Without autograd (validation, decoding) the layer runs plainly.
"""

from __future__ import annotations


import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import ModelConfig
from ..families import get as family
from ..swap import swapped

_CLASSES: dict[type, type] = {}


def checkpointed_class(base: type) -> type:
    """``base`` with a forward that recomputes in the backward (one class per base, so compile sees one type)."""
    if base not in _CLASSES:
        def forward(self, *args, **kwargs):
            if not torch.is_grad_enabled():
                return base.forward(self, *args, **kwargs)
            return checkpoint(base.forward, self, *args, use_reentrant=False, preserve_rng_state=draws_random(self),
                              **kwargs)

        _CLASSES[base] = type(f"Checkpointed{base.__name__}", (base,), {"forward": forward, "__module__": __name__})
    return _CLASSES[base]


def draws_random(layer: nn.Module) -> bool:
    """Does a forward of ``layer`` draw random numbers (active dropout)? Only then is the RNG state saved for the
    recomputation: reading it costs a device sync outside graphs and is not allowed while a CUDA graph is captured."""
    for m in layer.modules():
        if not m.training:
            continue
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        p = getattr(m, "attention_dropout", 0.0)  # transformers' attention: a float, applied functionally
        if isinstance(p, float) and p > 0:
            return True
    return False


def checkpointed(layer: nn.Module) -> nn.Module:
    """A module equal to ``layer`` (same attributes, the same submodule, parameter and buffer objects) whose
    forward is checkpointed. ``layer`` itself is left as it was."""
    return swapped(layer, checkpointed_class(type(layer)))


def is_checkpointed(module: nn.Module) -> bool:
    return type(module) in _CLASSES.values()


def _swap_every(layers: nn.ModuleList, every: int) -> int:
    """Checkpoint layers k-1, 2k-1, ... (every k-th, counted from 1); returns how many."""
    n = 0
    for i in range(every - 1, len(layers), every):
        if not is_checkpointed(layers[i]):
            layers[i] = checkpointed(layers[i])
            n += 1
    return n


def apply_activation_checkpointing(model: nn.Module, cfg: ModelConfig) -> str:
    """Swap every k-th decoder layer (model.llm.activation_checkpoint=k) and audio encoder block
    (model.encoder.activation_checkpoint=k) for a checkpointed one; the model family says where they are."""
    notes = []
    fam = family(cfg.family)
    if cfg.llm.activation_checkpoint:
        layers = fam.decoder_layers(model)
        n = _swap_every(layers, cfg.llm.activation_checkpoint)
        notes.append(f"{n} of {len(layers)} decoder layers")
    if cfg.encoder.activation_checkpoint:
        n = total = 0
        for blocks in fam.encoder_blocks(model):
            n += _swap_every(blocks, cfg.encoder.activation_checkpoint)
            total += len(blocks)
        notes.append(f"{n} of {total} encoder blocks")
    if not notes:
        return "activation_checkpoint: off"
    return f"activation_checkpoint: {' and '.join(notes)} recompute their activations in the backward"
