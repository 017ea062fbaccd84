"""Qwen3-ASR's fast path on CUDA (skipped without CUDA): speed.preset=fast (packing with varlen attention, the
frozen bf16 audio tower, compiled decoder layers, fused AdamW, label_head, fused projections) trains the tiny
demo model to the same losses as the plain eager step, within bf16 noise, on the same batches.

    python -m pytest tests/gpu/test_qwen3_asr_cuda.py -q        # on the GPU machine (transformers >= 5.24)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]


def losses(tmp_path, extra: list[str], n: int = 12) -> tuple[list[float], tuple]:
    from brisk.bench.harness import build_runner, sample_stream
    from brisk.config import load_config

    cfg = load_config(ROOT / "configs" / "qwen3_asr_demo.yaml",
                      [f"train.output_dir={tmp_path}", "train.device=cuda", "data.num_workers=0",
                       "model.encoder.freeze=true", "model.adaptor.freeze=true", "model.llm.dtype=bf16",
                       f"speed.inductor_cache_dir={tmp_path / 'ind'}", *extra])
    runner = build_runner(cfg)
    out = []
    for group in sample_stream(runner.cfg, n, 400):
        m = runner.run(runner.collate(group))
        out.append(float(m["loss"]))
    return out, runner.parts.plan.on


def test_the_fast_preset_keeps_the_losses_of_the_eager_step(tmp_path):
    ref, _ = losses(tmp_path / "a", [])
    fast, on = losses(tmp_path / "b", ["speed.preset=fast"])
    assert {"packing", "frozen_eval", "encoder_dtype", "compile", "fused_adamw", "label_head"} <= set(on)
    assert all(abs(a - b) < 0.05 * abs(a) + 0.02 for a, b in zip(ref, fast)), list(zip(ref, fast))
    assert fast[-1] < fast[0]
