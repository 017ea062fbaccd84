"""Variable-length attention for packed rows, plugged into transformers' attention interface.

Registered as ``brisk_varlen``. Without a mask function of its own, transformers builds no mask for it
(no [T, T] tensor, no host sync in mask creation); the packing boundaries come from ``cu_seq_lens_q``,
which the plain model's forward passes for packed batches. On CUDA it calls torch.nn.attention.varlen.varlen_attn
(FlashAttention-2, causal); on the CPU an equivalent SDPA call with a block-diagonal causal mask, which is
also the reference the CUDA kernel is tested against, and the path an fp32 LLM takes on CUDA (FlashAttention
has no fp32 kernel).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
import torch.nn.functional as F

NAME = "brisk_varlen"


def _varlen_kernel():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - torch < 2.10
        return None, False
    return varlen_attn, "enable_gqa" in inspect.signature(varlen_attn).parameters


# Looked up once at import: both attention functions run inside compiled blocks, where a lookup (inspect) each
# call would be traced.
_KERNEL, _HAS_GQA = _varlen_kernel()


def segment_of(cu_seqlens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The segment (sequence or window) of each position: how many of cu_seqlens[1:] are <= it, as
    searchsorted(cu_seqlens[1:], pos, right=True) gives. Counted by a comparison: Inductor's CUDA lowering of
    searchsorted on a slice of a cast buffer fails (NotImplementedError: SliceView, torch 2.11; an fp32 LLM's
    compiled layers on the GPU took this path), and [T, segments] comparisons cost nothing at these sizes."""
    return (pos[:, None] >= cu_seqlens[None, 1:]).sum(dim=1)


def block_causal_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """[T, T] bool: token i may see token j iff same sequence and j <= i."""
    pos = torch.arange(length, device=cu_seqlens.device)
    seq = segment_of(cu_seqlens, pos)
    return (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention signature: q [1, H, T, D], k/v [1, Hkv, T, D] -> ([1, T, H, D], None)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None or query.shape[0] != 1:
        raise ValueError("brisk_varlen attention needs a packed batch (one row and cu_seq_lens_q)")
    # The row length bounds every sequence in it; using it (not a per-batch int) keeps compiled code
    # free of a guard on the longest sequence, so a bucket never recompiles for a new batch.
    max_len = query.shape[2]
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, H, D]
    if query.is_cuda and _KERNEL is not None and query.dtype in (torch.float16, torch.bfloat16):
        extra = {}
        if k.shape[1] != q.shape[1]:
            if _HAS_GQA:
                extra["enable_gqa"] = True
            else:  # torch 2.11's varlen_attn has no GQA: repeat the KV heads
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = _KERNEL(q, k, v, cu, cu, max_len, max_len, scale=scaling, window_size=(-1, 0), **extra)
    else:
        t = q.shape[0]
        mask = block_causal_mask(cu, t)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                             enable_gqa=key.shape[1] != query.shape[1])
        return out.transpose(1, 2).contiguous(), None
    return out.unsqueeze(0), None


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                     scale: float | None = None) -> torch.Tensor:
    """Full (not causal) attention inside each window of a packed sequence: q, k, v [T, H, D], windows at
    ``cu_seqlens`` (int32, [W+1], on q's device), none longer than ``max_len`` -> [T, H, D]. One call for all
    windows, no host sync: varlen_attn on CUDA in bf16/fp16; elsewhere (the CPU, fp32) the windows gathered
    into one zero-padded batch [W, H, max_len, D] for one SDPA call with a key mask (a window's attention
    never sees another window's rows or the padding), and each row read back from its window."""
    if q.is_cuda and _KERNEL is not None and q.dtype in (torch.float16, torch.bfloat16):
        return _KERNEL(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, scale=scale, window_size=(-1, -1))
    t, cu = q.shape[0], cu_seqlens.to(torch.long)
    offset = torch.arange(max_len, device=q.device)
    starts, sizes = cu[:-1], cu[1:] - cu[:-1]
    valid = offset[None, :] < sizes[:, None]  # [W, L]
    rows = torch.where(valid, starts[:, None] + offset[None, :], 0)  # [W, L]; padding reads row 0, masked out
    q, k, v = [x[rows].transpose(1, 2) for x in (q, k, v)]  # [W, H, L, D]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)
    pos = torch.arange(t, device=q.device)
    window = segment_of(cu, pos)  # the window of each row
    return out.transpose(1, 2)[window, pos - cu[window]]  # [T, H, D]


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention)


@contextmanager
def padded_attention(llm):
    """Decoding runs left-padded rows with a KV cache, which brisk_varlen does not take (and transformers builds
    no padding mask for it): for its duration the LLM runs transformers' sdpa attention with its mask, then goes
    back to brisk_varlen. Captured training graphs keep their kernels; compiled layers run eagerly there."""
    previous = llm.config._attn_implementation
    llm.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        llm.set_attn_implementation(previous)


def apply_varlen_attention(llm) -> str:
    """Switch a transformers model to brisk_varlen (packed rows only)."""
    register()
    previous = llm.config._attn_implementation
    llm.set_attn_implementation(NAME)
    return f"packing: attention {previous} -> {NAME} (varlen_attn on CUDA)"
