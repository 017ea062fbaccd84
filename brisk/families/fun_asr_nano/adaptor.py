"""Transformer adaptor (FunASR's ``Transformer`` adaptor class) and the optional CTC head.

adaptor: frames [B, T, enc_dim] -> (stack k frames) -> Linear -> ReLU -> Linear -> n Transformer
encoder layers at llm_dim (FFN llm_dim // 4). Names match FunASR (linear1, linear2, blocks.N.*).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .sanm import FeedForward, masked_attention


class MultiHeadAttention(nn.Module):
    def __init__(self, n_head: int, dim: int, dropout: float):
        super().__init__()
        self.h, self.d_k = n_head, dim // n_head
        self.linear_q = nn.Linear(dim, dim)
        self.linear_k = nn.Linear(dim, dim)
        self.linear_v = nn.Linear(dim, dim)
        self.linear_out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: [B, T, D]; mask: [B, T] bool, True on real frames
        b, t, _ = x.shape
        q, k, v = (lin(x).view(b, t, self.h, self.d_k).transpose(1, 2)
                   for lin in (self.linear_q, self.linear_k, self.linear_v))
        att = masked_attention(q * self.d_k**-0.5, k, v, mask, self.dropout)
        return self.linear_out(att.transpose(1, 2).reshape(b, t, self.h * self.d_k))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, n_head: int, dropout: float):
        super().__init__()
        self.self_attn = MultiHeadAttention(n_head, dim, dropout)
        self.feed_forward = FeedForward(dim, dim // 4, dropout)
        self.norm1 = nn.LayerNorm(dim, eps=1e-12)
        self.norm2 = nn.LayerNorm(dim, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.self_attn(self.norm1(x), mask))
        return x + self.dropout(self.feed_forward(self.norm2(x)))


class TransformerAdaptor(nn.Module):
    def __init__(self, enc_dim: int, llm_dim: int, ffn_dim: int, n_layer: int, n_head: int,
                 downsample_rate: int = 1, dropout: float = 0.0):
        super().__init__()
        self.k = downsample_rate
        self.linear1 = nn.Linear(enc_dim * self.k, ffn_dim)
        self.linear2 = nn.Linear(ffn_dim, llm_dim)
        self.blocks = nn.ModuleList([EncoderLayer(llm_dim, n_head, dropout) for _ in range(n_layer)]) if n_layer else None

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        chunks = (t - 1) // self.k + 1
        x = F.pad(x, (0, 0, 0, chunks * self.k - t)).reshape(b, chunks, d * self.k)
        x = self.linear2(torch.relu(self.linear1(x)))
        out_lens = (lengths - 1) // self.k + 1
        if self.blocks is not None:
            mask = torch.arange(chunks, device=x.device)[None, :] < out_lens[:, None]
            for block in self.blocks:
                x = block(x, mask)
        return x, out_lens


class CTCHead(nn.Module):
    """The projection of FunASR's ``CTC`` module (``ctc.ctc_lo``)."""

    def __init__(self, dim: int, vocab_size: int):
        super().__init__()
        self.ctc_lo = nn.Linear(dim, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.ctc_lo(x), dim=-1)
