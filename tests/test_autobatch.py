"""data.auto_batch on the CPU: the binary search and the cache, with a made-up peak-memory function."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from brisk.config import ConfigError, load_config
from brisk.bench.autobatch import (BudgetCache, cache_key, find_batch_tokens, keep_schedule, largest_fitting, scaled,
                                   sized_to_gpu)

from .conftest import DEMO_CONFIG, tiny_overrides

GIB = 2**30
CANDIDATES = [2000, 3000, 4000, 6000, 8000, 12000, 16000, 24000, 32000, 48000, 64000]


def linear_peak(calls):
    def peak(c):  # 2 GiB of weights and state, 1 GiB per 2000 budget
        calls.append(c)
        return 2 * GIB + c / 2000 * GIB
    return peak


@pytest.mark.parametrize("limit_gib,best", [(100, 64000), (14, 24000), (13.9, 16000), (3, 2000), (2.5, None)])
def test_search_finds_the_largest_fitting_candidate(limit_gib, best):
    calls = []
    found = largest_fitting(linear_peak(calls), CANDIDATES, limit_gib * GIB)
    assert found.best == best
    assert len(calls) == len(set(calls)) <= 4  # log2(11) trials, none repeated
    assert all((found.peaks[c] <= limit_gib * GIB) == (best is not None and c <= best) for c in calls)


def test_out_of_memory_counts_as_too_large_and_other_errors_propagate():
    def peak(c):
        if c > 8000:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return c
    found = largest_fitting(peak, CANDIDATES, 1e12)
    assert found.best == 8000 and any(p == float("inf") for p in found.peaks.values())

    def broken(c):
        raise RuntimeError("shape mismatch")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        largest_fitting(broken, CANDIDATES, 1e12)


def _cfg(tmp_path, **extra):
    return load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"data.auto_batch.cache": str(tmp_path / "ab.json"),
                                                                 "data.auto_batch.enabled": True, **extra}))


def test_cache_measures_once_per_model_gpu_and_switches(tmp_path):
    cfg = _cfg(tmp_path)
    calls = []
    entry, cached = find_batch_tokens(cfg, linear_peak(calls), "H200", 20 * GIB)  # limit 0.85 * 20 = 17 GiB
    assert (entry["batch_tokens"], cached) == (24000, False) and calls
    n = len(calls)
    again, cached = find_batch_tokens(cfg, linear_peak(calls), "H200", 20 * GIB)
    assert cached and again == entry and len(calls) == n  # no trial step the second time
    # Another GPU, another switch, another model: measured again, each its own entry.
    find_batch_tokens(cfg, linear_peak(calls), "H100", 20 * GIB)
    ckpt = _cfg(tmp_path, **{"model.llm.activation_checkpoint": 1})
    find_batch_tokens(ckpt, linear_peak(calls), "H200", 20 * GIB)
    graphs = _cfg(tmp_path, **{"speed.packing": True})
    assert len({cache_key(c, "H200", 20 * GIB) for c in (cfg, ckpt, graphs)}) == 3
    assert len(json.loads((tmp_path / "ab.json").read_text())) == 3


def test_damaged_cache_file_is_measured_again(tmp_path):
    (tmp_path / "ab.json").write_text("{not json")
    calls = []
    entry, cached = find_batch_tokens(_cfg(tmp_path), linear_peak(calls), "H200", 20 * GIB)
    assert not cached and entry["batch_tokens"] == 24000
    assert BudgetCache(tmp_path / "ab.json").read()  # rewritten whole


def test_scaled_keeps_the_utterance_density(tmp_path):
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"data.batch_tokens": 6000, "data.max_utts": 10}))
    big = scaled(cfg, 48000)
    assert (big.data.batch_tokens, big.data.max_utts) == (48000, 80)
    assert cfg.data.batch_tokens == 6000  # the original is not changed


def test_the_found_batch_keeps_the_configured_schedule_per_token(tmp_path):
    """At the found batch the warm-up is scaled from the configured one (optim.warmup_step_tokens set to it, unless
    given); the same batch, or a schedule reference given by the user, is left as it is."""
    from brisk.train.optim import schedule_for

    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"data.batch_tokens": 6000, "optim.warmup_steps": 2500,
                                                               "train.accum_grad": 2}))
    kept = keep_schedule(cfg, scaled(cfg, 24000))
    assert kept.optim.warmup_step_tokens == 12000 and schedule_for(kept)[1] == 625
    assert schedule_for(kept)[0] == cfg.optim.lr  # lr itself only with optim.lr_scale
    assert keep_schedule(cfg, scaled(cfg, 6000)).optim.warmup_step_tokens == 0
    given = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"optim.warmup_step_tokens": 3000}))
    assert keep_schedule(given, scaled(given, 24000)).optim.warmup_step_tokens == 3000


def test_off_by_default_and_without_cuda(tmp_path):
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path))
    assert not cfg.data.auto_batch.enabled and sized_to_gpu(cfg) is cfg
    on = _cfg(tmp_path)
    if not torch.cuda.is_available():
        assert sized_to_gpu(on) is on


def test_bad_values_are_one_error_line(tmp_path):
    with pytest.raises(ConfigError, match="data.auto_batch.memory_frac=1.5"):
        _cfg(tmp_path, **{"data.auto_batch.memory_frac": 1.5})
    with pytest.raises(ConfigError, match="data.auto_batch.candidates"):
        _cfg(tmp_path, **{"data.auto_batch.candidates": [4000, 2000]})
    assert dataclasses.is_dataclass(_cfg(tmp_path).data.auto_batch)
