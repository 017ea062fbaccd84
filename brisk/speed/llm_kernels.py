"""Switches for the LLM's decoder: linear-attention layers under packing, flash-linear-attention kernels (the
Gated DeltaNet mix and its gated norm) and liger-kernel's fused linear cross-entropy (``model.family: causal_lm``),
liger-kernel's fused RMSNorm / SwiGLU (both tasks).

Each is ``apply_<switch>(model, cfg) -> note`` and swaps child modules of the model's LLM for instances of a
subclass of their own class that share the same parameters (the state dict, optimizer state, checkpoints and
exports are unchanged); nothing is patched at class or module level.

Why the linear-attention layers need a swap for packing: Gated DeltaNet (Qwen3.5 / Qwen3-Next) runs a short
causal convolution and a recurrence along the row. In a packed row both would carry state from one
conversation into the next. transformers' torch fallback ignores cu_seqlens for the convolution and, in
5.24, refuses cu_seqlens for the recurrence; ``apply_linear_attention_per_sequence`` runs each packed
sequence through the layer's own forward on its own (exact, one host read of cu_seqlens a layer: the
reference), ``apply_linear_attention_batched`` runs them as one right-padded batch through that forward (exact
for real tokens; one chunk loop a layer instead of one a sequence), and ``apply_fla_linear_attention`` runs
flash-linear-attention's varlen Triton kernels (short conv and chunked gated delta rule, both given cu_seqlens)
on the whole row (GPU; on Hopper with Triton 3.4-3.7.0 its gated backward runs through ``fla_hopper``'s
launcher, at the key head sizes the kernel check proved).

Note on defaults: transformers 5.24 binds flash-linear-attention at import time when the package is
installed, for every model in the process; brisk's default (no swap) is then transformers' choice. The
benchmark keeps the package off the path of its torch-path arms.
"""

from __future__ import annotations

import importlib.util
import sys

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError
from ..swap import swap_class as subclass
from ..swap import swapped
from .fla_hopper import hopper_refusal, in_window, register_launcher, triton_version


def available(package: str) -> bool:
    """Importable (or already imported), without importing it."""
    return package in sys.modules or importlib.util.find_spec(package) is not None


def fla_refusal(head_k_dims=()) -> str | None:
    """Why flash-linear-attention's gated delta rule cannot train here, or None. fla 0.6 refuses its gated
    backward on Hopper with Triton 3.4-3.7.0 (torch 2.11's Triton 3.6); brisk runs that one kernel at the
    block widths its kernel check proves (``fla_hopper``) and refuses the key head sizes it does not cover."""
    if not available("fla"):
        return "speed.fla_kernels needs flash-linear-attention (pip install fla-core)"
    if torch.cuda.is_available() and triton_version() is None:
        return "speed.fla_kernels needs Triton"
    return hopper_refusal(head_k_dims)


def linear_attention_layers(llm: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) of every Gated DeltaNet layer (recognised by its parameters)."""
    out = []
    for parent in llm.modules():
        for name, child in parent.named_children():
            if hasattr(child, "A_log") and hasattr(child, "dt_bias") and hasattr(child, "in_proj_qkv"):
                out.append((parent, name, child))
    return out


def swap_class(module: nn.Module, mixin: type) -> nn.Module:
    """A new instance of (mixin, type(module)) holding the very same parameters, buffers and submodules."""
    return swapped(module, subclass(type(module), mixin))


def _swap_all(llm: nn.Module, layers, mixin: type) -> int:
    for parent, name, child in layers:
        setattr(parent, name, swap_class(child, mixin))
    return len(layers)


def _cached(args, kwargs) -> bool:
    """Called with a decoding cache (transformers 5.24 names it cache, 5.17 cache_params; or positionally)."""
    return (args and args[0] is not None) or kwargs.get("cache") is not None or kwargs.get("cache_params") is not None


# --------------------------------------------------------------------------- packing, reference path
def _packed_bounds(hidden_states: torch.Tensor, args, kwargs: dict) -> list[int] | None:
    """Takes the varlen keys out of ``kwargs`` (the layer's own forward would pass them on to its kernels) and
    returns the row's sequence boundaries when this call is a packed row to split, else None. The boundaries
    are one host read a layer: the sizes decide the pieces' shapes."""
    cu = kwargs.pop("cu_seq_lens_q", None)
    for k in ("cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids"):
        kwargs.pop(k, None)
    if cu is None or hidden_states.shape[0] != 1 or _cached(args, kwargs):
        return None
    return cu.tolist()


class PerSequence:
    """Gated DeltaNet on a packed row: each sequence of cu_seqlens through the layer's own forward (eager inside a
    compiled decoder layer: the pieces' shapes are the batch's lengths)."""

    @torch.compiler.disable
    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        bounds = _packed_bounds(hidden_states, args, kwargs)
        if bounds is None:
            return super().forward(hidden_states, *args, **kwargs)
        pieces = [super(PerSequence, self).forward(hidden_states[:, a:b], *args, **kwargs)
                  for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        return torch.cat(pieces, dim=1)


def _swap_for_packing(model, mixin: type, name: str, how: str) -> str:
    n = _swap_all(model.llm, linear_attention_layers(model.llm), mixin)
    if not n:
        return f"linear attention {name}: no linear-attention layer in this model (nothing swapped)"
    return f"linear attention {name}: {n} Gated DeltaNet layers {how}"


def apply_linear_attention_per_sequence(model, cfg=None) -> str:
    return _swap_for_packing(model, PerSequence, "per sequence", "run each packed sequence on its own (the layer's "
                             "own forward; exact, one host read of cu_seqlens a layer)")


class PaddedBatch:
    """Gated DeltaNet on a packed row: the row's sequences right-padded into one batch [N, longest, D], through
    the layer's own forward once, then back into the row. Exact for every real token: the short conv, the
    chunked recurrence and the in-chunk solve are causal, so the padding after a sequence never reaches it;
    the padding's own outputs are dropped. One chunk loop of longest/64 iterations a layer instead of one a
    sequence (PerSequence), for the padded positions' compute (N x longest against the row's tokens). Eager
    inside a compiled decoder layer: the batch's shape is the row's lengths."""

    @torch.compiler.disable
    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        bounds = _packed_bounds(hidden_states, args, kwargs)
        if bounds is None:
            return super().forward(hidden_states, *args, **kwargs)
        kwargs["attention_mask"] = None  # the row's mask (if any) is [1, T]; right padding needs none
        spans = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        row = hidden_states[0]
        batch = torch.nn.utils.rnn.pad_sequence([row[a:b] for a, b in spans], batch_first=True)
        out = super().forward(batch, *args, **kwargs)
        return torch.cat([out[i, :b - a] for i, (a, b) in enumerate(spans)], dim=0)[None]


def apply_linear_attention_batched(model, cfg=None) -> str:
    return _swap_for_packing(model, PaddedBatch, "batched", "run a packed row's sequences as one right-padded batch "
                             "(the layer's own forward once; exact for real tokens, one host read of cu_seqlens a layer)")


# ------------------------------------------------------------------------- flash-linear-attention
class FlaVarlen:
    """Gated DeltaNet through flash-linear-attention's Triton kernels: the short causal conv and the chunked
    gated delta rule, both varlen (cu_seqlens) on a packed row, batched on a padded one. Computes what the
    layer's own forward computes (same parameters, same order of operations outside the kernels)."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        if _cached(args, kwargs):  # decoding keeps transformers' own path
            return super().forward(hidden_states, *args, **kwargs)
        cu = kwargs.get("cu_seq_lens_q")
        mask = kwargs.get("attention_mask")
        if mask is not None and cu is None:
            hidden_states = hidden_states * mask[:, :, None].to(hidden_states.dtype)
        b, t, _ = hidden_states.shape
        beta = self.in_proj_b(hidden_states).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(hidden_states).float() + self.dt_bias)
        out = _fla_mix(self, self.in_proj_qkv(hidden_states), beta, g, cu, kwargs.get("fla_chunk_indices"))
        z = self.in_proj_z(hidden_states).reshape(-1, self.head_v_dim)
        out = self.norm(out.reshape(-1, self.head_v_dim), z).reshape(b, t, -1)
        return self.out_proj(out)


_STEP_CU: list = [None, None, None, None]  # the packed row's cu_seqlens as the layers get it, its version, int64 copy, host copy


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return None


def step_cu_seqlens(cu: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The packed row's cu_seqlens for fla: one int64 tensor on the device and one on the host, the same objects
    for every Gated DeltaNet layer of a step, forward and backward. fla memoises its chunk indices by the identity
    of the tensor it is given (fla.utils tensor_cache) and reads the counts from ``cu_seqlens_cpu`` when given
    one; a new int64 copy a layer misses that memo, and each miss reads the device from the host (a sync) inside
    the layer. Keyed on the incoming tensor's identity and version: a new batch, or one rewritten in place,
    gets its own copies (one host read a step)."""
    if cu is None:
        return None, None
    version = _version(cu)
    if _STEP_CU[0] is not cu or version is None or _STEP_CU[1] != version:
        wide = cu.to(torch.int64, copy=True)  # a copy even of an int64 cu: fla memoises by the object it gets
        _STEP_CU[:] = [cu, version, wide, wide.cpu()]
    return _STEP_CU[2], _STEP_CU[3]


@torch.compiler.disable
def _fla_mix(layer: nn.Module, mixed_qkv: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, cu,
             chunks: torch.Tensor | None = None) -> torch.Tensor:
    """fla's short conv and chunked gated delta rule of one Gated DeltaNet layer -> [B, T, H_v, D_v]. Opaque to
    Dynamo (torch.compiler.disable): fla's launchers (autotuners, host-side shape checks) are not traceable, so a
    compiled decoder layer runs these two kernels eagerly between its graphs (one graph break a layer) and
    compiles the projections, gates, norms and MLP around them.

    ``chunks``: the batch's chunk indices (an aligned packed row, Batch.chunk_indices): fla then reads nothing
    from the host, so a CUDA graph can hold the layer. Its cu_seqlens is a new int64 tensor each call, so that
    fla's memo of offsets by tensor identity (fla.utils tensor_cache) never hands a capture the offsets of a
    warm-up's tensor."""
    from fla.modules.causal_conv1d.ops import causal_conv1d
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    b, t, _ = mixed_qkv.shape
    extra = {}
    if chunks is not None:
        cu, cu_cpu, extra = cu.to(torch.int64, copy=True), None, {"chunk_indices": chunks}
    else:
        cu, cu_cpu = step_cu_seqlens(cu)
    qkv, _ = causal_conv1d(mixed_qkv, weight=layer.conv1d.weight.squeeze(1), bias=layer.conv1d.bias,
                           activation=layer.activation, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, **extra)
    q, k, v = torch.split(qkv, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    q = q.reshape(b, t, -1, layer.head_k_dim)
    k = k.reshape(b, t, -1, layer.head_k_dim)
    v = v.reshape(b, t, -1, layer.head_v_dim)
    if layer.num_v_heads > layer.num_k_heads:
        q = q.repeat_interleave(layer.num_v_heads // layer.num_k_heads, dim=2)
        k = k.repeat_interleave(layer.num_v_heads // layer.num_k_heads, dim=2)
    out, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                    cu_seqlens_cpu=cu_cpu, **extra)
    return out


def apply_fla_linear_attention(model, cfg=None) -> str:
    layers = linear_attention_layers(model.llm)
    if not layers:
        return "fla kernels: no linear-attention layer in this model (nothing swapped)"
    refusal = fla_refusal([layer.head_k_dim for _, _, layer in layers])
    if refusal:
        raise ConfigError(refusal)
    how = ""
    if torch.cuda.is_available() and in_window(torch.cuda.get_device_capability(), triton_version()):
        register_launcher()  # fla's gated backward at the checked block widths (fla alone refuses it here)
        how = (" (its gated backward through brisk's launcher at the checked block width: fla refuses it on Hopper "
               "with this Triton)")
    n = _swap_all(model.llm, layers, FlaVarlen)
    return f"fla kernels: {n} Gated DeltaNet layers run flash-linear-attention's varlen conv + chunked delta rule{how}"


# --------------------------------------------------------------------------------------- liger
def _rmsnorm_offset(norm: nn.Module) -> float | None:
    """0 for weight * x_hat (Llama/Qwen3), 1 for (1 + weight) * x_hat (Qwen3.5/Qwen3-Next); None: not a plain
    RMSNorm (the gated norm inside Gated DeltaNet takes two inputs and stays)."""
    name = type(norm).__name__
    if not name.endswith("RMSNorm") or getattr(norm, "weight", None) is None or norm.weight.dim() != 1:
        return None
    return 1.0 if name.startswith(("Qwen3_5", "Qwen3Next")) else 0.0


class LigerNorm:
    offset, casting = 0.0, "llama"

    def forward(self, x):
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
        return LigerRMSNormFunction.apply(x, self.weight, eps, self.offset, self.casting, False)


class LigerNormPlusOne(LigerNorm):
    offset, casting = 1.0, "gemma"  # (1 + weight), computed in fp32 as Qwen3.5's own norm does


class LigerMLP:
    """down(silu(gate(x)) * up(x)) with the SiLU and product in one kernel; gate and up from one GEMM when the
    MLP is already speed.fuse_projections' (its ``gate_up``)."""

    def forward(self, x):
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        if hasattr(self, "gate_up") and torch.is_grad_enabled():
            gate, up = self.gate_up(x)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(LigerSiLUMulFunction.apply(gate, up))


def _is_swiglu(module: nn.Module) -> bool:
    act = getattr(module, "act_fn", None)
    return all(hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj")) and \
        type(act).__name__ in ("SiLU", "SiLUActivation")


def apply_liger_kernels(model, cfg=None) -> str:
    """liger-kernel's fused RMSNorm and SwiGLU MLP, per instance, on the same parameters (CUDA)."""
    if not available("liger_kernel"):
        raise ConfigError("speed.liger needs liger-kernel (pip install liger-kernel)")
    norms = mlps = 0
    for parent in list(model.llm.modules()):
        for name, child in list(parent.named_children()):
            offset = _rmsnorm_offset(child)
            if offset is not None:
                setattr(parent, name, swap_class(child, LigerNormPlusOne if offset else LigerNorm))
                norms += 1
            elif _is_swiglu(child):
                setattr(parent, name, swap_class(child, LigerMLP))
                mlps += 1
    return f"liger: {norms} RMSNorms and {mlps} SwiGLU MLPs run liger-kernel's fused kernels (same parameters)"


# -------------------------------------------------------------------------- the gated norm
def _rms_norm_gated():
    try:
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
    except ImportError:  # fla before 0.5 kept the module one level up
        from fla.modules.fused_norm_gate import rms_norm_gated
    return rms_norm_gated


def _is_gated_norm(module: nn.Module) -> bool:
    """transformers' gated RMSNorm of a Gated DeltaNet layer (Qwen3.5 / Qwen3-Next): norm(x) * weight * silu(gate)."""
    name = type(module).__name__
    return name.startswith(("Qwen3_5", "Qwen3Next")) and name.endswith("RMSNormGated") and \
        getattr(module, "weight", None) is not None


class FlaGatedNorm:
    """norm(x) * weight * silu(gate) as one flash-linear-attention kernel forward and one backward (its
    ``rms_norm_gated``) instead of eight elementwise kernels and their backward. fla computes it in fp32 and
    rounds once; transformers' module rounds norm(x) to the input dtype before the weight (the same in fp32)."""

    @torch.compiler.disable  # fla's launcher is not traceable: eager between a compiled layer's graphs
    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
        return _rms_norm_gated()(hidden_states, gate, self.weight, None, activation="swish", eps=eps)


def apply_fla_gated_norm(model, cfg=None) -> str:
    """Every gated RMSNorm of the LLM's Gated DeltaNet layers through fla's fused kernel (same parameters; CUDA).
    The plain RMSNorms (Qwen3.5's 1 + weight ones included) are speed.liger's."""
    if not available("fla"):
        raise ConfigError("speed.fla_gated_norm needs flash-linear-attention (pip install fla-core)")
    norms = [(parent, name, child) for parent in model.llm.modules() for name, child in parent.named_children()
             if _is_gated_norm(child)]
    if not norms:
        already = sum(type(m).__name__ == "FusedRMSNormGated" for m in model.llm.modules())
        return (f"fla_gated_norm: the {already} gated norms are fla's FusedRMSNormGated already (transformers' "
                "choice; nothing swapped)" if already else "fla_gated_norm: no gated RMSNorm in this model (nothing "
                "swapped)")
    return f"fla_gated_norm: {_swap_all(model.llm, norms, FlaGatedNorm)} gated RMSNorms run fla's fused kernel " \
           "(same parameters)"


def liger_loss(cfg=None):
    """A StepHooks.loss: hidden states, then liger-kernel's fused linear cross-entropy (the LM head and the
    loss in chunks; no [T, vocab] logits). The argmax-correct count is not computed (returned as 0)."""
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

    fused = LigerFusedLinearCrossEntropyLoss(ignore_index=-100, reduction="mean")

    def loss(model, batch, rows, stats: bool):
        hidden = (model(batch, hidden=True) if rows is None else model(batch, audio_rows=rows, hidden=True))[:, :-1]  # [B, T-1, D]
        target = batch.labels[:, 1:].reshape(-1)
        head = model.llm.get_output_embeddings()
        value = fused(head.weight, hidden.reshape(-1, hidden.shape[-1]), target)
        count = (target != -100).sum()
        return None, value.float(), torch.zeros_like(count), count

    return loss
