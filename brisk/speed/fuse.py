"""speed.fuse_projections: one GEMM for q, k and v, and one for gate and up, in every decoder layer.

At a few hundred rows a step each projection is a small GEMM whose time is launch and latency, not FLOPs.
With the weights concatenated (a copy of a few MB a layer, each step) q/k/v take one GEMM forward and two
backward instead of three and six, gate/up one and two instead of two and four.

Applied as module swaps (brisk/swap.py): each layer's attention and MLP becomes an instance of a subclass
of its own class that holds the very same child modules, so the parameters, state dict, optimizer state,
checkpoints and exports are the same with the switch on or off. The subclass's forward is its parent's with
the projections fused. With a KV cache (decoding) or without autograd (validation, decoding) it runs the
parent's forward unchanged: a weight copy per decoded token would cost more than the launches it saves.
Memory: autograd keeps each layer's concatenated weights for the backward (one more copy of those weights
until the backward). The numbers are the plain ones up to the GEMM's summation order (CPU test).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..swap import swap_class, swapped
from .compile import decoder_stack


class _FusedQKV:
    """Mixin for a transformers attention of the Qwen3 / Llama layout (q/k/v/o_proj, optional q_norm/k_norm,
    rotary embeddings, the attention-function registry of its modeling module)."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
        if args or kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None \
                or not torch.is_grad_enabled():
            return super().forward(hidden_states, position_embeddings, attention_mask, *args, **kwargs)
        kwargs.pop("cache", None)
        kwargs.pop("past_key_values", None)
        modeling = sys.modules[self._swapped_from.__module__]
        q, k, v = self.q_proj, self.k_proj, self.v_proj
        bias = None if q.bias is None else torch.cat([q.bias, k.bias, v.bias])
        qs, ks, vs = F.linear(hidden_states, torch.cat([q.weight, k.weight, v.weight]), bias).split(
            [q.out_features, k.out_features, v.out_features], -1)
        input_shape = hidden_states.shape[:-1]
        shape = (*input_shape, -1, self.head_dim)
        query, key, value = qs.view(shape), ks.view(shape), vs.view(shape)
        if hasattr(self, "q_norm"):
            query, key = self.q_norm(query), self.k_norm(key)
        query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        cos, sin = position_embeddings
        query, key = modeling.apply_rotary_pos_emb(query, key, cos, sin)
        impl = self.config._attn_implementation
        attention = modeling.eager_attention_forward if impl == "eager" else modeling.ALL_ATTENTION_FUNCTIONS[impl]
        extra = {"sliding_window": self.sliding_window} if hasattr(self, "sliding_window") else {}
        out, weights = attention(self, query, key, value, attention_mask,
                                 dropout=0.0 if not self.training else self.attention_dropout,
                                 scaling=self.scaling, **extra, **kwargs)
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), weights


class _FusedGateUp:
    """Mixin for a gated MLP: down(act(gate(x)) * up(x))."""

    def forward(self, x):
        if not torch.is_grad_enabled():
            return super().forward(x)
        gate, up = self.gate_up(x)
        return self.down_proj(self.act_fn(gate) * up)

    def gate_up(self, x):
        """gate(x), up(x) from one GEMM (speed.liger's SwiGLU takes them from here too)."""
        g, u = self.gate_proj, self.up_proj
        bias = None if g.bias is None else torch.cat([g.bias, u.bias])
        return F.linear(x, torch.cat([g.weight, u.weight]), bias).split([g.out_features, u.out_features], -1)


def swap_module(parent: nn.Module, name: str, mixin: type) -> None:
    """Replace ``parent.<name>`` by an instance of its fused subclass holding the same parameters and children."""
    old = getattr(parent, name)
    setattr(parent, name, swapped(old, swap_class(type(old), mixin, "Fused")))


def _linears(module: nn.Module, names: tuple[str, ...]) -> bool:
    mods = [getattr(module, n, None) for n in names]
    return all(type(m) is nn.Linear for m in mods) and len({m.bias is None for m in mods}) == 1


def _attention_ok(attn: nn.Module) -> bool:
    modeling = sys.modules.get(type(attn).__module__)
    return (attn is not None and _linears(attn, ("q_proj", "k_proj", "v_proj")) and hasattr(attn, "o_proj")
            and hasattr(attn, "head_dim") and hasattr(attn, "scaling") and modeling is not None
            and all(hasattr(modeling, n) for n in ("apply_rotary_pos_emb", "eager_attention_forward",
                                                    "ALL_ATTENTION_FUNCTIONS")))


def apply_fuse_projections(llm: nn.Module) -> str:
    try:
        layers = decoder_stack(llm).layers
    except ValueError:
        raise ConfigError("speed.fuse_projections: no decoder stack (model.<base>.layers) in this LLM; "
                          "set speed.fuse_projections=false") from None
    for i, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not (_attention_ok(attn) and mlp is not None and _linears(mlp, ("gate_proj", "up_proj"))
                and hasattr(mlp, "down_proj") and hasattr(mlp, "act_fn")):
            raise ConfigError(f"speed.fuse_projections: decoder layer {i} is not the q/k/v + gate/up/down layout this "
                              "switch knows (Qwen3, Llama-like); set speed.fuse_projections=false")
    for layer in layers:
        swap_module(layer, "self_attn", _FusedQKV)
        swap_module(layer, "mlp", _FusedGateUp)
    return (f"fuse_projections: q/k/v and gate/up as one GEMM each in {len(layers)} decoder layers "
            "(module swaps; weights concatenated each step; parameters and state dict unchanged)")
