"""speed.packing on the CPU: the packed layout computes the padded layout's loss, and no token sees another
utterance."""

from __future__ import annotations

import torch

from brisk.config import load_config
from brisk.data.collate import Collator, bucket
from brisk.data.loader import build_split
from brisk.models.build import build_model
from brisk.models.lm import lm_loss
from brisk.speed.varlen import block_causal_mask, varlen_attention

from .conftest import DEMO_CONFIG, tiny_overrides


def _samples(cfg, n=6):
    split = build_split(cfg, "train", Collator(), 483)
    idx = split.sampler.batches(0)[0][:n]
    return [split.dataset[(i, 0)] for i in idx]


def test_packed_loss_equals_padded_loss_fp32(tmp_path):
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0}))
    model = build_model(cfg).eval()
    samples = _samples(cfg)
    padded = Collator()(samples)
    packed = Collator(packed=True, token_buckets=(64, 128, 256, 512))(samples)
    assert packed.input_ids.shape[0] == 1 and packed.input_ids.shape[1] == bucket(padded.n_tokens, [64, 128, 256, 512])
    with torch.no_grad():
        l1, c1, n1 = lm_loss(model(padded), padded.labels)
        l2, c2, n2 = lm_loss(model(packed), packed.labels)
    assert n1.item() == n2.item() == padded.n_label_tokens
    assert torch.allclose(l1, l2, rtol=1e-5, atol=1e-6), (l1.item(), l2.item())
    assert c1.item() == c2.item()


def test_packed_static_layout_is_fixed_size(tmp_path):
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path))
    samples = _samples(cfg, 3)
    col = Collator(packed=True, token_buckets=(256, 512), speech_buckets=(32, 64), pad_utts=10, static=True)
    b = col(samples)
    assert b.cu_seqlens.numel() == 12 and b.audio_pos.numel() == b.input_ids.shape[1]
    assert b.speech.shape[0] == 10 and b.speech.shape[1] in (32, 64)
    assert (b.audio_pos[sum(b.slot_counts):] == b.input_ids.shape[1]).all()  # padding slots hit the scratch row


def test_no_token_attends_across_utterances(tmp_path):
    """Changing one utterance must leave every other utterance's logits untouched (the test fails if
    attention crosses utterance boundaries), and the CPU varlen path equals the dense block mask."""
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0}))
    model = build_model(cfg).eval()
    samples = _samples(cfg, 4)
    col = Collator(packed=True, token_buckets=(512,))
    a = col(samples)
    b = col(samples)
    first_len = len(samples[0].tokens.input_ids)
    b.input_ids[0, 3:first_len] = (b.input_ids[0, 3:first_len] + 7) % 483  # edit utterance 0 only
    with torch.no_grad():
        la, lb = model(a), model(b)
    rest = slice(first_len, a.n_tokens)
    assert not torch.allclose(la[0, :first_len], lb[0, :first_len])
    assert torch.equal(la[0, rest], lb[0, rest])


def test_varlen_reference_matches_per_sequence_attention():
    torch.manual_seed(0)
    lens = [5, 9, 3, 7]
    t = sum(lens) + 8
    cu = torch.tensor([0, 5, 14, 17, 24, t], dtype=torch.int32)
    q = torch.randn(1, 4, t, 16)
    k = torch.randn(1, 2, t, 16)
    v = torch.randn(1, 2, t, 16)
    out, _ = varlen_attention(None, q, k, v, None, scaling=0.25, cu_seq_lens_q=cu)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True,
                                                               scale=0.25, enable_gqa=True)
        assert torch.allclose(out[0, s:e], ref[0].transpose(0, 1), atol=1e-5)
    mask = block_causal_mask(cu, t)
    assert mask.sum().item() == sum(n * (n + 1) // 2 for n in [5, 9, 3, 7, 8])


def test_segment_of_counts_boundaries_as_searchsorted_does():
    """segment_of replaced searchsorted(cu[1:], pos, right=True) (Inductor's CUDA lowering failed on it): the same
    segment for every position, including padding after the last sequence and empty sequences."""
    from brisk.speed.varlen import segment_of

    for cu in ([0, 3, 3, 7, 10], [0, 5], [0, 2, 4, 6]):
        c = torch.tensor(cu, dtype=torch.int32)
        pos = torch.arange(12)
        want = torch.searchsorted(c.long()[1:], pos, right=True)
        assert torch.equal(segment_of(c, pos), want), cu


def test_block_causal_mask_compiles_with_dynamic_shapes():
    """The mask inside a compiled block (Inductor, dynamic length), as an fp32 LLM's compiled layers build it."""
    from brisk.speed.varlen import block_causal_mask

    fn = torch.compile(block_causal_mask, dynamic=True, fullgraph=True)
    for cu, t in (([0, 3, 7], 8), ([0, 4, 9, 12], 12)):
        c = torch.tensor(cu, dtype=torch.int32)
        assert torch.equal(fn(c, t), block_causal_mask(c, t))
