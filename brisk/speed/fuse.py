"""speed.fuse_projections: one GEMM for q, k and v, and one for gate and up, in every decoder layer.

At a few hundred rows a step each projection is a small, latency-bound GEMM: the H200 profile of the fast
path has 1,031 GEMMs a step at 5.8 us each, 37% of its device time (bench/results/2026-11-29-h200-round2c).
With the weights concatenated (a copy of a few MB a layer) q/k/v take one GEMM forward and two backward
instead of three and six, gate/up one and two instead of two and four: 9 fewer GEMMs a layer.

The parameters stay the model's own tensors: the state dict, optimizer state, checkpoints and exports are
the same with the switch on or off. Only the forward of the projection modules is replaced:
- MLP: [gate | up] from one ``F.linear``, split.
- attention: q_proj, k_proj and v_proj share one ``_FusedQKV``. The q call computes [q | k | v] for its input
  and keeps k and v; the k and v calls hand them out when given that same input tensor, and otherwise
  compute their own (the plain linear). transformers' attention calls q, k, v in that order on one tensor.
The numbers are the plain ones up to the GEMM's summation order (CPU test: fp32, 1e-6).
Memory: autograd keeps each layer's concatenated weights for the backward (the plain GEMMs keep the
parameters themselves): about one more copy of those weights until the backward, ~0.6 GB for Qwen3-0.6B in
bf16. Without autograd (validation, decoding) the plain projections run.
"""

from __future__ import annotations

from types import MethodType

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError


class _FusedQKV:
    """The shared state of one attention module's three projections (plain attributes, traced by Dynamo).

    Only with autograd on (training): without it (validation, decoding one token at a time) the three plain
    GEMMs run, since a copy of the weights for every token would cost more than the launches it saves."""

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear):
        self.mods = (q, k, v)
        self.sizes = [m.out_features for m in self.mods]
        self.x = self.k_out = self.v_out = None

    def _plain(self, i: int, x: torch.Tensor) -> torch.Tensor:
        self.x = self.k_out = self.v_out = None  # a miss: keep nothing of an earlier call
        return F.linear(x, self.mods[i].weight, self.mods[i].bias)

    def q(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self._plain(0, x)
        q, k, v = self.mods
        bias = None if q.bias is None else torch.cat([q.bias, k.bias, v.bias])
        out_q, self.k_out, self.v_out = F.linear(x, torch.cat([q.weight, k.weight, v.weight]), bias).split(self.sizes, -1)
        self.x = x
        return out_q

    def k(self, x: torch.Tensor) -> torch.Tensor:
        if self.x is x and self.k_out is not None:
            out, self.k_out = self.k_out, None
            return out
        return self._plain(1, x)

    def v(self, x: torch.Tensor) -> torch.Tensor:
        if self.x is x and self.v_out is not None:
            out = self.v_out
            self.x = self.v_out = None  # nothing of this step is held after it
            return out
        return self._plain(2, x)


def _gate_up_forward(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Installed as a bound method (types.MethodType): every layer's forward then has the same code object and
    Dynamo's guard on it holds for all layers, so one compiled graph still serves all 28 (a functools.partial
    is guarded by identity: a graph per layer, and layers past the recompile limit of 8 run uncompiled)."""
    if not torch.is_grad_enabled():
        return type(mlp).forward(mlp, x)  # the model's own MLP
    g, u = mlp.gate_proj, mlp.up_proj
    bias = None if g.bias is None else torch.cat([g.bias, u.bias])
    gate, up = F.linear(x, torch.cat([g.weight, u.weight]), bias).split([g.out_features, u.out_features], -1)
    return mlp.down_proj(mlp.act_fn(gate) * up)


def _linears(module: nn.Module, names: tuple[str, ...]) -> list[nn.Linear] | None:
    mods = [getattr(module, n, None) for n in names]
    ok = all(type(m) is nn.Linear for m in mods) and len({m.bias is None for m in mods}) == 1
    return mods if ok else None


def apply_fuse_projections(llm: nn.Module) -> str:
    from .compile import decoder_stack

    try:
        layers = decoder_stack(llm).layers
    except ValueError:
        raise ConfigError("speed.fuse_projections: no decoder stack (model.<base>.layers) in this LLM; "
                          "set speed.fuse_projections=false") from None
    for i, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        qkv = _linears(attn, ("q_proj", "k_proj", "v_proj")) if attn is not None else None
        gate_up = _linears(mlp, ("gate_proj", "up_proj")) if mlp is not None else None
        if qkv is None or gate_up is None or not hasattr(mlp, "down_proj") or not hasattr(mlp, "act_fn"):
            raise ConfigError(f"speed.fuse_projections: decoder layer {i} is not the q/k/v + gate/up/down layout this "
                              "switch knows (Qwen3, Llama-like); set speed.fuse_projections=false")
        shared = _FusedQKV(*qkv)
        for proj, fn in zip(qkv, (shared.q, shared.k, shared.v)):
            proj.forward = fn
        mlp.forward = MethodType(_gate_up_forward, mlp)
    return (f"fuse_projections: q/k/v and gate/up as one GEMM each in {len(layers)} decoder layers "
            "(weights concatenated each step; parameters and state dict unchanged)")
