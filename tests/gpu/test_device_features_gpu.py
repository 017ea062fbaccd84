"""Frontend.batch on CUDA (skipped without it): the features of a batch against the CPU ones, within the stated
tolerance, and the fast Recognizer's transcripts the same with features on the GPU as with CPU features."""

from __future__ import annotations

import pytest
import torch

from brisk.families.fun_asr_nano.config import FrontendConfig
from brisk.families.fun_asr_nano.features import Frontend

from ..conftest import DEMO
from ..test_device_features import GPU_TOL, waves

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("cmvn", [False, True], ids=["plain", "cmvn"])
def test_cuda_batch_features_match_the_cpu_ones(cmvn):
    fe = Frontend(FrontendConfig(dither=0.0, cmvn_file=str(DEMO / "am.mvn") if cmvn else None))
    ws = waves()
    feats, lengths = fe.batch(ws, "cuda")
    assert feats.is_cuda
    worst = 0.0
    for w, f, n in zip(ws, feats.cpu(), lengths.tolist()):
        ref = fe(w)
        assert n == ref.shape[0]
        worst = max(worst, float((f[:n] - ref).abs().max()))
        assert not f[n:].any()
    print(f"max |cuda - cpu| = {worst:.2e}")
    assert worst <= GPU_TOL
