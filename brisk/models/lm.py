"""What every model family shares: the dtype names of the config, a causal LM run on input embeddings in a batch's
layout, the causal-LM loss, and parameter counts as the log prints them."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.batch import Batch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # model.llm.dtype, train.export_dtype, ...


def run_causal_lm(module: nn.Module, embeds: torch.Tensor, batch: Batch, dtype: torch.dtype):
    """A causal LM (or its decoder stack) on input embeddings in the batch's layout: the attention mask when
    padded; per-sequence position_ids and cu_seqlens (varlen attention kernels read them) when packed."""
    attn_kwargs = {}
    if batch.layout == "packed":
        attn_kwargs = dict(cu_seq_lens_q=batch.cu_seqlens, cu_seq_lens_k=batch.cu_seqlens)
    autocast = torch.autocast(embeds.device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    with autocast:
        return module(inputs_embeds=embeds.to(dtype), attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids, use_cache=False, **attn_kwargs)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FunASR's (transformers') causal-LM loss: mean cross-entropy of next-token targets, fp32 logits.

    Returns (loss, correct, count): the argmax-equals-label count and the label count, both kept on the
    device so that reading them costs no sync until the caller asks.
    """
    logits = logits[:, :-1]
    target = labels[:, 1:]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)
    with torch.no_grad():
        valid = target != -100
        correct = ((logits.argmax(-1) == target) & valid).sum()
        count = valid.sum()
    return loss, correct, count


def param_count(module: nn.Module, trainable: bool | None = None) -> int:
    seen, n = set(), 0
    for p in module.parameters():
        if id(p) in seen or (trainable is not None and p.requires_grad != trainable):
            continue
        seen.add(id(p))
        n += p.numel()
    return n


def human(n: float) -> str:
    for unit in ("", "K", "M", "B"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}T"

