"""data.auto_batch on CUDA (skipped without it): real trial steps, the search and the cache.

    python -m pytest tests/gpu/test_autobatch_gpu.py -q        # on the GPU machine
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REPO = Path(__file__).resolve().parents[2]
FAST = ["speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true"]


def test_trial_peaks_grow_and_the_search_keeps_the_largest_fitting(tmp_path):
    from brisk.config import load_config
    from brisk.bench.autobatch import sized_to_gpu, trial_runner

    from tests.gpu.test_gpu_state import SMALL

    cand = [2000, 8000, 32000]
    cfg = load_config(REPO / "configs/fun_asr_nano.yaml", SMALL + FAST + [
        "data.auto_batch.enabled=true", f"data.auto_batch.cache={tmp_path / 'ab.json'}",
        f"data.auto_batch.candidates={cand}", "data.auto_batch.trial_batches=4"])
    with trial_runner(cfg) as (_, peak):
        peaks = [peak(c) for c in cand]
    assert peaks[0] < peaks[1] < peaks[2], peaks
    total = torch.cuda.get_device_properties(0).total_memory
    # A target between the second and the third candidate's peak: the search must stop at the second.
    frac = (peaks[1] + peaks[2]) / 2 / total
    cfg.data.auto_batch.memory_frac = frac
    out = sized_to_gpu(cfg)
    assert out.data.batch_tokens == 8000 and out.data.max_utts > cfg.data.max_utts
    # Cached: the second call measures nothing (a peak function that fails would be noticed).
    assert sized_to_gpu(cfg).data.batch_tokens == 8000
    assert (tmp_path / "ab.json").is_file()
