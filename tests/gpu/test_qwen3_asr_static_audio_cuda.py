"""Qwen3-ASR's frozen audio tower in a CUDA graph per step bucket (skipped without CUDA; transformers >= 5.24):
the tower's inputs padded to fixed shapes by the tower itself (``Qwen3ASR.static_audio_inputs``: real chunks,
row indices, windows padded with zero-length ones), captured once (``GraphedAudioInputs``) and replayed on
batches of other lengths, against the eager tower on the same batches: in fp32 (one masked SDPA call on padded
windows in both) to float rounding, in bf16 (varlen_attn with the bucket's fixed max_seqlen and trailing
zero-length windows, against varlen_attn on the batch's own windows) within bf16 noise; the padding slots' rows
zero; no host sync in a replay.

    python -m pytest tests/gpu/test_qwen3_asr_static_audio_cuda.py -q
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from .test_qwen3_asr_audio_varlen_cuda import BATCHES, batch, tiny

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SLOTS, SEGMENTS = 1024, 12  # a bucket's audio slots and cu_seqlens entries


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _static_batch(speech, counts):
    """What static_audio_inputs reads of a static packed batch: features, slot counts, the fixed slot and
    cu_seqlens sizes."""
    return SimpleNamespace(speech=speech, slot_counts=counts, audio_pos=torch.empty(SLOTS, device="cuda"),
                           cu_seqlens=torch.empty(SEGMENTS, device="cuda"))


@contextmanager
def _no_tf32():
    """fp32 GEMMs and convolutions in full fp32 (whatever an earlier test set): the comparison is then of
    summation order alone."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _graphed_and_eager(tmp_path, dtype):
    """Per batch of BATCHES: (graphed rows [SLOTS, D], eager rows [real, D], real) through one tower graph."""
    from brisk.speed.audio_varlen import apply_audio_varlen
    from brisk.speed.frozen import FrozenAudio
    from brisk.speed.graph import GraphedAudioInputs

    model = tiny(tmp_path)  # windows of 2 chunks: several an utterance
    apply_audio_varlen([model.audio_tower.layers])
    path = FrozenAudio(model, dtype, names=("audio_tower", "multi_modal_projector")).path
    graphed = GraphedAudioInputs(path, torch.cuda.graph_pool_handle())
    out = []
    for lengths in BATCHES:  # one capture (the first), then replays on other lengths and utterance counts
        speech, lens, counts = batch(lengths, seed=len(lengths))
        rows = graphed(_static_batch(speech.to(dtype), counts)).clone()
        out.append((rows, path.encode_audio(speech.to(dtype), lens, counts), sum(counts)))
    assert len(graphed.graphs) == 1
    for rows, eager, real in out:
        assert rows.shape == (SLOTS, eager.shape[1]) and real == eager.shape[0] < SLOTS
        assert torch.isfinite(rows).all() and rows[real:].abs().sum() == 0  # the padding slots: zero
    return out


@torch.no_grad()
def test_graphed_fp32_tower_rows_equal_the_eager_rows(tmp_path):
    """fp32 (the masked SDPA call on padded windows in both), TF32 off: equal up to summation order (the
    convolutions run on another number of chunks, the GEMMs on another number of rows)."""
    with _no_tf32():
        out = _graphed_and_eager(tmp_path, torch.float32)
    assert max(_rel(rows[:real], eager) for rows, eager, real in out) < 1e-4


@torch.no_grad()
def test_graphed_bf16_tower_rows_are_the_eager_rows_within_bf16_noise(tmp_path):
    """bf16 (varlen_attn: the bucket's fixed max_seqlen and trailing zero-length windows in the graph, the
    batch's own windows eagerly), against the fp32 rows: at most 3% of the rows' scale from the eager bf16 rows,
    and no further from fp32 than twice the eager bf16 rows are."""
    with _no_tf32():
        ref32 = _graphed_and_eager(tmp_path / "fp32", torch.float32)
        out = _graphed_and_eager(tmp_path / "bf16", torch.bfloat16)
    for (rows, eager, real), (_, exact, _) in zip(out, ref32):
        ours, theirs, scale = rows[:real].float(), eager.float(), exact.abs().max()
        assert (ours - theirs).abs().max() < 0.03 * scale
        err_ours, err_theirs = (ours - exact).abs().max(), (theirs - exact).abs().max()
        assert err_ours < 2 * err_theirs + 1e-3 * scale, (err_ours, err_theirs)


@torch.no_grad()
def test_a_replay_of_the_tower_does_not_sync_with_the_host(tmp_path):
    from brisk.speed.audio_varlen import apply_audio_varlen
    from brisk.speed.frozen import FrozenAudio
    from brisk.speed.graph import GraphedAudioInputs

    model = tiny(tmp_path)
    apply_audio_varlen([model.audio_tower.layers])
    path = FrozenAudio(model, torch.bfloat16, names=("audio_tower", "multi_modal_projector")).path
    graphed = GraphedAudioInputs(path, torch.cuda.graph_pool_handle())
    first = batch(BATCHES[0])
    graphed(_static_batch(first[0].bfloat16(), first[2]))
    inputs = [(s.bfloat16(), c) for s, _, c in (batch(b, seed=7) for b in BATCHES[1:])]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = [graphed(_static_batch(s, c)).float().sum() for s, c in inputs]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(x).item() for x in out)
