"""speed.float8 on CUDA (skipped without CUDA, torchao or float8 GEMMs: compute capability 8.9+): a tiny Qwen3 in
bf16 whose dimensions the float8 GEMM takes, 6 optimizer steps with and without the switch, eager and compiled,
on the same batches: the float8 losses stay within 5% of bf16's and the run trains.

    python -m pytest tests/gpu/test_float8_cuda.py -q        # on the GPU machine, with torchao
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
DENSE = ["model.llm.config={model_type: qwen3, vocab_size: 392, hidden_size: 256, intermediate_size: 768, "
         "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, tie_word_embeddings: false}"]


def _losses(tmp_path, extra: list[str], n: int = 6) -> list[float]:
    from brisk.bench.harness import build_runner, sample_stream
    from brisk.config import load_config

    cfg = load_config(ROOT / "configs" / "sft_demo.yaml",
                      [f"train.output_dir={tmp_path}", "train.device=cuda", "data.num_workers=0", "model.llm.dtype=bf16",
                       "speed.packing=true", "speed.fused_adamw=true", "optim.warmup_steps=2",
                       f"speed.inductor_cache_dir={tmp_path.parent / 'ind'}", *DENSE, *extra])
    runner = build_runner(cfg)
    return [float(runner.run(runner.collate(g))["loss"]) for g in sample_stream(runner.cfg, n, 400)]


@pytest.mark.parametrize("compiled", [False, True])
def test_float8_keeps_the_bf16_losses_within_its_rounding(tmp_path, compiled):
    pytest.importorskip("torchao.float8")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no float8 GEMMs on this GPU")
    extra = ["speed.compile=true"] if compiled else []
    base = _losses(tmp_path / "a", extra)
    f8 = _losses(tmp_path / "b", extra + ["speed.float8=true"])
    assert max(abs(x - y) / abs(x) for x, y in zip(base, f8)) < 5e-2, list(zip(base, f8))
    assert f8 != base and f8[-1] < f8[0]
