"""speed.audio_varlen: the audio tower's windowed attention as one variable-length call a layer.

Qwen3-ASR's audio tower attends within windows (n_window_infer mel frames; a batch holds dozens). Unless
transformers' attention implementation is a flash-attention one, its audio attention splits q/k/v at the window
boundaries read back to the host (``lengths.tolist()``: a device sync in every layer) and runs one attention
call per window, which makes a Qwen3-ASR step host-bound and gives a compiled encoder block a graph break and
a new graph for every new set of window lengths. Here each audio attention becomes a subclass of its own
class (a module swap, brisk/swap.py: same projections, same parameters and state dict) whose forward makes one
call for all windows (``speed.varlen.window_attention``: varlen_attn on CUDA in bf16, one masked SDPA call on
padded windows elsewhere). The window boundaries are the ones the model passes each layer (computed once a
batch, on the host: the family's audio_windows), so nothing in the tower reads the device.
"""

from __future__ import annotations

from torch import nn

from ..errors import ConfigError
from ..swap import swap_class, swapped
from .varlen import window_attention


class _OneCallWindows:
    """Mixin for transformers' Qwen3-ASR audio attention (q/k/v/out_proj with biases, num_heads, scaling)."""

    def forward(self, hidden_states, cu_seqlens, max_seqlen=None, **kwargs):
        t = hidden_states.shape[0]
        q, k, v = [p(hidden_states).view(t, self.num_heads, -1) for p in (self.q_proj, self.k_proj, self.v_proj)]
        out = window_attention(q, k, v, cu_seqlens, t if max_seqlen is None else max_seqlen, self.scaling)
        return self.out_proj(out.reshape(t, -1))


def _is_audio_attention(attn) -> bool:
    return attn is not None and all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj",
                                                               "num_heads", "scaling"))


def apply_audio_varlen(block_lists: list) -> str:
    """Swap the self-attention of every block in ``block_lists`` (the family's encoder blocks, of the model and
    of the frozen path's copies) for the one-call version."""
    blocks = [b for lst in block_lists for b in lst]
    for i, block in enumerate(blocks):
        if not _is_audio_attention(getattr(block, "self_attn", None)):
            raise ConfigError(f"speed.audio_varlen: audio block {i} has no windowed self_attn of the Qwen3-ASR "
                              "layout (q/k/v/out_proj); set speed.audio_varlen=false")
    for block in blocks:
        old = block.self_attn
        block.self_attn = swapped(old, swap_class(type(old), _OneCallWindows, "OneCall"))
    return (f"audio_varlen: {len(blocks)} audio attention layers run all windows in one call (varlen_attn on CUDA in "
            "bf16, else one masked SDPA call); window boundaries computed on the host once a batch")


def audio_blocks(family, model: nn.Module, path: nn.Module | None) -> list:
    """The encoder block lists of the model and, when the frozen audio path is a copy, of the copy."""
    out = list(family.encoder_blocks(model))
    if path is not None and path is not model:
        out += list(family.encoder_blocks(path))
    return out
