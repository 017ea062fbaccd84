"""A chat model built on a GPU is made in model.llm.dtype directly (skipped without CUDA): its build never holds
an fp32 copy (a 27B model's would nearly fill one H200), and its LoRA adapters and frozen base are what the
meta-device estimate counted.

    python -m pytest tests/gpu/test_chat_build_cuda.py -q        # on the GPU machine
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from brisk.bench.memory_estimate import estimate
from brisk.config import load_config
from brisk.families import family_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
MID = ["model.llm.config.hidden_size=1024", "model.llm.config.intermediate_size=4096",
       "model.llm.config.num_hidden_layers=8", "model.llm.config.vocab_size=32000"]
LORA = ["model.llm.lora.enabled=true", "model.llm.lora.only=true", "model.llm.lora.dropout=0.0",
        "model.llm.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        "model.llm.activation_checkpoint=1"]


@pytest.mark.parametrize("extra", [[], LORA, [*LORA, "model.llm.lora.dtype=fp32"]])
def test_bf16_build_on_cuda_peaks_at_its_bf16_size(extra):
    cfg = load_config(ROOT / "configs/sft_qwen3_1p7b.yaml", [*MID, "train.device=cuda", *extra])
    est = estimate(cfg, 1024)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = family_of(cfg).build(cfg, torch.device("cuda"))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    params = list({id(p): p for p in model.parameters()}.values())
    adapters = torch.float32 if "model.llm.lora.dtype=fp32" in extra else torch.bfloat16  # made so, never cast
    assert {p.dtype for p in params if not p.requires_grad} <= {torch.bfloat16}
    assert {p.dtype for p in params if p.requires_grad} == {adapters if extra else torch.bfloat16}
    assert {p.device.type for p in params} == {"cuda"}
    held = sum(p.numel() * p.element_size() for p in params)
    assert held == est.weight_bytes  # what the meta count said
    # fp32 first would peak near 2x (its copy before the cast); made in bf16 the build peaks at its own size plus
    # one init's scratch (the largest tensor, the embedding, in fp32 at most)
    largest = max(p.numel() for p in params) * 4
    assert peak <= held + largest, (peak, held)
    assert est.trainable == sum(p.numel() for p in params if p.requires_grad)
