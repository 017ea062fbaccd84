"""What every model family shares: the dtype names of the config, a causal LM run on input embeddings in a batch's
layout, the causal-LM loss, and parameter counts as the log prints them."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.batch import AudioBatch, Batch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # model.llm.dtype, train.export_dtype, ...


def run_causal_lm(module: nn.Module, embeds: torch.Tensor, batch: Batch, dtype: torch.dtype):
    """A causal LM (or its decoder stack) on input embeddings in the batch's layout: the attention mask when
    padded; per-sequence position_ids and cu_seqlens (varlen attention kernels read them) when packed."""
    attn_kwargs = {}
    if batch.layout == "packed":
        attn_kwargs = dict(cu_seq_lens_q=batch.cu_seqlens, cu_seq_lens_k=batch.cu_seqlens)
    if batch.chunk_indices is not None:  # fla's Gated DeltaNet layers take them (brisk.speed.llm_kernels.FlaVarlen)
        attn_kwargs["fla_chunk_indices"] = batch.chunk_indices
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


class SpeechLM(nn.Module):
    """The text side every speech family shares: audio rows spliced into the LLM's input embeddings at the batch's
    audio positions, then the causal LM (or its decoder stack, for hidden states) on them. A subclass sets ``llm``
    and ``llm_dtype`` and gives ``audio_rows(batch)``: its own audio path."""

    llm: nn.Module
    llm_dtype: torch.dtype

    def audio_rows(self, batch) -> torch.Tensor:  # pragma: no cover - each family's own
        raise NotImplementedError

    def embed(self, batch: Batch, audio_rows: torch.Tensor | None) -> torch.Tensor:
        emb = self.llm.get_input_embeddings()(batch.input_ids)  # [B, T, D]
        if audio_rows is None or audio_rows.numel() == 0:
            return emb
        b, t, d = emb.shape
        # One scratch row past the end takes the padding slots (audio_pos == B*T), then is dropped.
        flat = torch.cat([emb.reshape(b * t, d), emb.new_zeros(1, d)])
        flat = flat.index_copy(0, batch.audio_pos, audio_rows.to(emb.dtype))
        return flat[:-1].view(b, t, d)

    def forward(self, batch: Batch, audio_rows: torch.Tensor | None = None, hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, vocab], or with ``hidden`` the final hidden states [B, T, D] (after the LLM's last norm,
        before lm_head). ``audio_rows`` may be given precomputed (a frozen or cached encoder). ``hidden`` is a
        forward argument, not only a method, so that a DDP-wrapped model can be asked for it too."""
        if hidden:
            return self.hidden_states(batch, audio_rows)
        return self._run_llm(self.llm, batch, audio_rows).logits

    def hidden_states(self, batch: Batch, audio_rows: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder stack's last hidden states [B, T, D]: what lm_head would turn into logits."""
        return self._run_llm(self.llm.base_model, batch, audio_rows).last_hidden_state

    def _run_llm(self, module: nn.Module, batch: Batch, audio_rows: torch.Tensor | None):
        """``module`` (the causal LM, or its decoder stack) on the batch's spliced embeddings."""
        if audio_rows is None and isinstance(batch, AudioBatch) and batch.speech is not None:
            audio_rows = self.audio_rows(batch)
        return run_causal_lm(module, self.embed(batch, audio_rows), batch, self.llm_dtype)
