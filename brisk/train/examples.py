"""Synthetic Fun-ASR-Nano batches of every bucket's shapes, for capturing CUDA graphs before training (that
family's ``graph_examples``)."""

from __future__ import annotations

from ..config import Config
from ..data.dataset import SyntheticDataset
from ..speed.graph import MAX_GRAPH_TOKENS


def example_batches(cfg: Config, collator, vocab: int, max_tokens: int = MAX_GRAPH_TOKENS) -> list:
    """One synthetic batch per token bucket up to ``max_tokens``, and one per speech bucket (for capturing CUDA
    graphs up front)."""
    fe = cfg.model.frontend
    dim, low = fe.n_mels * fe.lfr_m, cfg.model.adaptor.use_low_frame_rate
    out = []
    # One sample of exactly t tokens lands in bucket t (a shorter one would fall into a smaller bucket and
    # leave bucket t to be captured, and compiled, in the middle of training).
    fixed = len(SyntheticDataset([(600, 0)], dim, vocab, fe.lfr_n, use_low_frame_rate=low)[0].tokens.input_ids)
    for t in cfg.speed.pack_buckets:
        if t > max_tokens:
            break
        ds = SyntheticDataset([(600, max(0, t - fixed))], dim, vocab, fe.lfr_n, use_low_frame_rate=low)
        out.append(collator([ds[0]]))
    for f in cfg.speed.speech_buckets:  # also every speech bucket, so encoder graphs exist up front
        ds = SyntheticDataset([(max(1, f * fe.lfr_n - 1), 4)], dim, vocab, fe.lfr_n, use_low_frame_rate=low)
        out.append(collator([ds[0]]))
    return out

