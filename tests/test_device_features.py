"""Frontend.batch: the Kaldi fbank + LFR + CMVN equations as batched torch ops (validation, eval, transcribe)."""

from __future__ import annotations


import pytest
import torch

from brisk.families.fun_asr_nano.config import FrontendConfig
from brisk.data.audio import read_audio
from brisk.families.fun_asr_nano.features import Frontend

from .conftest import DEMO

# On the CPU the batched ops compute what the per-utterance ones do up to CPU_TOL (a one-frame matrix product
# may take another kernel; most utterances match bit for bit); on a GPU (cuFFT, another summation order in the
# mel projection) within GPU_TOL (tests/gpu/test_device_features_gpu.py). Log-mel values span about 0 to 25.
CPU_TOL = 1e-5
GPU_TOL = 5e-3


def waves():
    files = sorted((DEMO / "audio" / "valid").glob("*.flac"))[:6]
    g = torch.Generator().manual_seed(0)
    extra = [0.1 * torch.randn(n, generator=g) for n in (401, 1000, 16000 + 7)]  # one window; odd lengths
    return [read_audio(str(f), 16000) for f in files] + extra + [0.1 * torch.randn(300, generator=g)]  # under a window


@pytest.mark.parametrize("cmvn", [False, True], ids=["plain", "cmvn"])
def test_batch_features_equal_the_per_utterance_ones(cmvn):
    cfg = FrontendConfig(dither=0.0, cmvn_file=str(DEMO / "am.mvn") if cmvn else None)
    fe = Frontend(cfg)
    ws = waves()
    feats, lengths = fe.batch(ws, "cpu")
    assert feats.shape[0] == len(ws) and feats.shape[2] == fe.dim
    for w, f, n in zip(ws, feats, lengths.tolist()):
        ref = fe(w)
        assert n == ref.shape[0] == fe.num_frames(w.numel()) or w.numel() < 400
        assert (f[:n] - ref).abs().max() <= CPU_TOL
        assert not f[n:].any()  # zeros past the utterance's length
    # Every utterance at least one window long: the fully batched path (no per-utterance fallback).
    feats2, lengths2 = fe.batch(ws[:-1], "cpu")
    assert torch.equal(lengths2, lengths[:-1]) and torch.allclose(feats2, feats[:-1, : feats2.shape[1]], atol=CPU_TOL)


def test_other_lfr_and_window_settings():
    cfg = FrontendConfig(dither=0.0, lfr_m=5, lfr_n=3, window="povey", n_mels=40)
    fe = Frontend(cfg)
    ws = waves()[:-1]
    feats, lengths = fe.batch(ws)
    for w, f, n in zip(ws, feats, lengths.tolist()):
        assert (f[:n] - fe(w)).abs().max() <= CPU_TOL
