"""SANM audio encoder: self-attention plus an FSMN memory block (FunASR's SenseVoiceEncoderSmall).

Parameter names follow FunASR's so a FunASR ``model.pt`` loads with ``strict=True``:
``encoders0.0.*`` (the block that maps the 560-dim LFR frames to d_model), ``encoders.N.*``,
``after_norm``, ``tp_encoders.N.*``, ``tp_norm``. There is no time downsampling.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import EncoderConfig


class LayerNorm32(nn.LayerNorm):
    """LayerNorm computed in fp32 whatever the input dtype (FunASR's SANM LayerNorm; torch's eps 1e-5)."""

    def __init__(self, dim: int):
        super().__init__(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).type_as(x)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.w_2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))


def sinusoidal_encoding(length: int, depth: int, device, dtype) -> torch.Tensor:
    """FunASR's SinusoidalPositionEncoder: positions 1..T, [sin | cos] halves. Returns [1, T, depth]."""
    positions = torch.arange(1, length + 1, device=device, dtype=dtype)
    log_inc = math.log(10000.0) / (depth / 2 - 1)
    inv = torch.exp(torch.arange(depth // 2, device=device, dtype=dtype) * -log_inc)
    scaled = positions[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=-1)[None]


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dropout: nn.Module) -> torch.Tensor:
    """Softmax attention over real keys, written out op by op as FunASR does (q already scaled).

    Kept explicit rather than SDPA so that the encoder matches FunASR's numbers to float32 rounding;
    the encoder is frozen in the recipe, runs without autograd, and is graphed in the fast path.
    q, k, v: [B, H, T, d]; mask: [B, T] bool, True on real frames.
    """
    pad = ~mask[:, None, None, :]
    scores = torch.matmul(q, k.transpose(-2, -1)).masked_fill(pad, float("-inf"))
    attn = torch.softmax(scores, dim=-1).masked_fill(pad, 0.0)
    return torch.matmul(dropout(attn), v)


class SANMAttention(nn.Module):
    """Multi-head self-attention with an FSMN (depthwise conv) memory on the values."""

    def __init__(self, n_head: int, in_dim: int, dim: int, dropout: float, kernel_size: int, shift: int):
        super().__init__()
        assert dim % n_head == 0
        self.h, self.d_k = n_head, dim // n_head
        self.linear_q_k_v = nn.Linear(in_dim, dim * 3)
        self.linear_out = nn.Linear(dim, dim)
        self.fsmn_block = nn.Conv1d(dim, dim, kernel_size, groups=dim, bias=False)
        left = (kernel_size - 1) // 2 + max(shift, 0)
        self.pad = (left, kernel_size - 1 - left)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: [B, T, in_dim]; mask: [B, T] bool, True on real frames
        b, t, _ = x.shape
        q, k, v = self.linear_q_k_v(x).split(self.h * self.d_k, dim=-1)
        keep = mask[:, :, None].to(v.dtype)
        mem = F.pad((v * keep).transpose(1, 2), self.pad)
        mem = self.fsmn_block(mem).transpose(1, 2) + v * keep
        mem = self.dropout(mem) * keep

        q, k, vh = (z.reshape(b, t, self.h, self.d_k).transpose(1, 2) for z in (q, k, v))
        att = masked_attention(q * self.d_k**-0.5, k, vh, mask, self.dropout)
        return self.linear_out(att.transpose(1, 2).reshape(b, t, self.h * self.d_k)) + mem


class SANMBlock(nn.Module):
    def __init__(self, in_dim: int, dim: int, cfg: EncoderConfig):
        super().__init__()
        self.self_attn = SANMAttention(
            cfg.attention_heads, in_dim, dim, cfg.attention_dropout_rate, cfg.kernel_size, cfg.sanm_shift
        )
        self.feed_forward = FeedForward(dim, cfg.linear_units, cfg.dropout_rate)
        self.norm1 = LayerNorm32(in_dim)
        self.norm2 = LayerNorm32(dim)
        self.dropout = nn.Dropout(cfg.dropout_rate)
        self.residual = in_dim == dim

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = self.dropout(self.self_attn(self.norm1(x), mask))
        x = x + y if self.residual else y
        return x + self.dropout(self.feed_forward(self.norm2(x)))


class SANMEncoder(nn.Module):
    def __init__(self, input_size: int, cfg: EncoderConfig):
        super().__init__()
        d = cfg.output_size
        self.output_size = d
        self.encoders0 = nn.ModuleList([SANMBlock(input_size, d, cfg)])
        self.encoders = nn.ModuleList([SANMBlock(d, d, cfg) for _ in range(cfg.num_blocks - 1)])
        self.after_norm = LayerNorm32(d)
        self.tp_encoders = nn.ModuleList([SANMBlock(d, d, cfg) for _ in range(cfg.tp_blocks)])
        self.tp_norm = LayerNorm32(d)

    def forward(self, speech: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # speech: [B, T, 560] LFR frames, zero-padded; lengths: [B]
        t = speech.shape[1]
        mask = torch.arange(t, device=speech.device)[None, :] < lengths[:, None]
        x = speech * self.output_size**0.5
        x = x + sinusoidal_encoding(t, x.shape[-1], x.device, x.dtype)
        for block in self.encoders0:
            x = block(x, mask)
        for block in self.encoders:
            x = block(x, mask)
        x = self.after_norm(x)
        for block in self.tp_encoders:
            x = block(x, mask)
        return self.tp_norm(x), lengths
