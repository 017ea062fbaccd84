"""Model FLOPs of a training token, and model FLOPs utilisation (MFU) against a measured matmul peak.

The convention is PaLM's (Chowdhery et al. 2022, appendix B): the FLOPs the model itself needs, whatever the
implementation does, so that every arm of a benchmark is scored by the same count and MFU is proportional to
its tokens/s. One difference: PaLM counts the whole square of attention scores (12 x layers x heads x head_dim x
sequence length a token); this count takes the causal half, which a causal kernel computes. Recomputation
(activation checkpointing) is not counted, nor is work an implementation skips (speed.label_head computes the
LM head on labelled rows only; the count has it on every row).

- Matmuls: every 2-D parameter of the LLM (linear layers, the LM head, LoRA's A and B), except the input
  embedding where it is not also the LM head (a lookup), 2 FLOPs a weight a token forward. The backward takes 2
  for the input's gradient and, where the weight trains, 2 for the weight's: 6 a trainable weight, 4 a frozen
  one (LoRA's base).
- Softmax attention: for each full-attention layer and each sequence of length s, QK^T and the weighted sum of
  V over the causal half, 2 x 2 x heads x head_dim x s^2 / 2 forward, three times that with the backward.
- Not counted: embeddings (a lookup), norms and elementwise work, the short convolution and the chunked
  recurrence of Gated DeltaNet layers (a few percent of their projections at Qwen3.5's sizes).

The peak is measured, not read from a data sheet: brisk.bench.harness.matmul_rate, bf16 GEMMs of 8,192 cubed on
the device the benchmark runs on. A parameter of three or more dimensions that is not a convolution's (a
mixture of experts' stacked weights) is refused rather than left out of the count.
"""

from __future__ import annotations

from torch import nn


def attention_layers(llm: nn.Module) -> tuple[int, int]:
    """(full-attention layers, heads x head_dim of one) of a transformers decoder: layer_types where the config
    has them (hybrid models), else every layer."""
    cfg = llm.config.get_text_config() if hasattr(llm.config, "get_text_config") else llm.config
    types = getattr(cfg, "layer_types", None)
    layers = sum(t == "full_attention" for t in types) if types else cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return layers, cfg.num_attention_heads * head_dim


def training_flops(llm: nn.Module, seq_lens: list[int]) -> float:
    """Model FLOPs of one forward + backward over sequences of ``seq_lens`` tokens (one training step's)."""
    tokens = sum(seq_lens)
    lookup = llm.get_input_embeddings().weight
    head = llm.get_output_embeddings()
    if head is not None and head.weight is lookup:  # tied: the one matrix is the LM head's too
        lookup = None
    convs = {id(m.weight) for m in llm.modules() if isinstance(m, nn.modules.conv._ConvNd)}
    for name, p in llm.named_parameters():
        if p.dim() > 2 and id(p) not in convs:
            raise ValueError(f"model FLOPs: parameter {name} has {p.dim()} dimensions and is not a convolution's "
                             "(experts?); brisk.bench.flops counts linear layers only")
    linear = sum(p.numel() * (6 if p.requires_grad else 4) for p in llm.parameters()
                 if p.dim() == 2 and p is not lookup)  # parameters() yields a tied tensor once
    layers, width = attention_layers(llm)
    attention = 3 * layers * 2 * width * sum(s * s for s in seq_lens)
    return float(linear * tokens + attention)
