"""brisk.bench.memory_estimate: a config's memory floor counted on the meta device, checked against a real CPU
build (tiny model) and against what LoRA and checkpointing must change (the 9B and 27B configs, meta only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from brisk.bench.memory_estimate import estimate
from brisk.config import load_config
from brisk.families import family_of

ROOT = Path(__file__).resolve().parents[1]
LORA = ["model.llm.lora.enabled=true", "model.llm.lora.only=true", "model.llm.lora.r=8",
        "model.llm.lora.target_modules=[q_proj,v_proj,gate_proj]"]


def tiny(*extra: str):
    return load_config(ROOT / "configs/sft_demo.yaml", ["model.llm.dtype=bf16", *extra])


@pytest.mark.parametrize("extra", [[], LORA, [*LORA, "model.llm.lora.dtype=fp32"]])
def test_meta_count_equals_a_real_build(extra):
    cfg = tiny(*extra)
    est = estimate(cfg, 1024)
    model = family_of(cfg).build(cfg, "cpu")  # real tensors, as `brisk train` makes them on the CPU
    params = list({id(p): p for p in model.parameters()}.values())
    assert all(p.device.type == "cpu" for p in params)
    frozen = sum(p.numel() * p.element_size() for p in params if not p.requires_grad)
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    adapters = "float32" if "model.llm.lora.dtype=fp32" in extra else "bfloat16"
    assert est.weights.get("bfloat16 frozen", 0) == frozen and est.weights.get(f"{adapters} trainable", 0) == trainable
    assert est.grads == trainable and est.optimizer == 2 * trainable
    assert est.trainable == sum(p.numel() for p in params if p.requires_grad)


def test_lora_leaves_gradients_and_moments_to_the_adapters():
    full, lora = estimate(tiny(), 1024), estimate(tiny(*LORA), 1024)
    assert full.trainable == full.params and lora.trainable < full.params / 10
    assert lora.params == full.params + lora.trainable  # the base plus the adapters
    assert lora.optimizer == 2 * lora.grads < full.optimizer


def test_fp32_adapters_count_four_bytes_and_fp32_moments():
    """model.llm.lora.dtype=fp32 over the bf16 base: the adapters' weights, gradients and AdamW moments double;
    the frozen base and everything else stay."""
    bf16, fp32 = estimate(tiny(*LORA), 1024), estimate(tiny(*LORA, "model.llm.lora.dtype=fp32"), 1024)
    n = fp32.trainable
    assert n == bf16.trainable and fp32.weights["float32 trainable"] == 4 * n == 2 * bf16.weights["bfloat16 trainable"]
    assert fp32.weights["bfloat16 frozen"] == bf16.weights["bfloat16 frozen"]
    assert fp32.grads == 4 * n and fp32.optimizer == 8 * n
    assert fp32.floor - bf16.floor == (4 + 4 + 8 - 2 - 2 - 4) * n


def test_checkpointed_inputs_grow_with_tokens_and_the_head_chunks():
    hidden, layers = 128, 2
    plain = estimate(tiny(), 1024)
    ck = estimate(tiny("model.llm.activation_checkpoint=1"), 1024)
    ck2 = estimate(tiny("model.llm.activation_checkpoint=1"), 2048)
    assert plain.checkpointed == 0 and plain.checkpointed_inputs == 0
    assert ck.checkpointed == layers and ck.checkpointed_inputs == layers * 1024 * hidden * 2  # bf16 inputs
    assert ck2.checkpointed_inputs == 2 * ck.checkpointed_inputs
    vocab = 392
    assert plain.head == 1024 * vocab * (2 + 4 + 4)  # full logits, fp32 copy, gradient
    chunked = estimate(tiny("speed.label_head=true"), 1024)
    assert chunked.head == 512 * vocab * 8 < plain.head
    assert "a gathered row kept for the backward" in chunked.head_how  # not in the floor: named
    recomputed = estimate(tiny("speed.label_head=true", "speed.label_head_recompute=true"), 1024)
    assert recomputed.head == chunked.head and "kept" not in recomputed.head_how


@pytest.mark.parametrize("name, layers, billions", [("sft_qwen3_5_9b", 32, 8.99), ("sft_qwen3_5_27b_lora", 64, 27.0)])
def test_big_lora_configs_count_on_meta(name, layers, billions):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml", ["speed.label_head=true"])
    est = estimate(cfg, 8192)
    assert est.params / 1e9 == pytest.approx(billions, abs=0.01)
    # the base frozen in bf16 (no fp32 copy), the adapters in fp32 (model.llm.lora.dtype, PEFT's default)
    assert set(est.weights) == {"bfloat16 frozen", "float32 trainable"}
    assert 0 < est.trainable < est.params / 100  # only the adapters train
    assert est.weights["float32 trainable"] == est.grads == 4 * est.trainable and est.optimizer == 8 * est.trainable
    assert est.checkpointed == est.layers == layers
    assert est.weights["bfloat16 frozen"] == 2 * (est.params - est.trainable)
    assert est.floor < 0.45 * 139 * 2**30 if "27b" in name else est.floor < 22e9  # fits: one H200; Unsloth's 22 GB


def test_meta_build_allocates_nothing():
    cfg = load_config(ROOT / "configs/sft_qwen3_5_27b_lora.yaml", [])
    model = family_of(cfg).build(cfg, "meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}  # the adapters
