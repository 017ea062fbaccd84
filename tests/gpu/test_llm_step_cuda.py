"""The rest of the hybrid's step on CUDA (skipped without CUDA or without the package): the fused norms against
transformers' modules in bf16, and speed.compile's decoder layers (Inductor; fla's calls eager between the
graphs) against the eager step for a few optimizer steps, dense Qwen3 and hybrid Qwen3.5 on packed rows.

    python -m pytest tests/gpu/test_llm_step_cuda.py -q        # on the GPU machine, with fla-core + liger-kernel

Tolerances: a bf16 output or gradient counts as equal when its error against the fp32 computation of the same
module is at most twice transformers' own bf16 error plus 1e-3 (norm-wise, relative): the fused kernel rounds
once where transformers rounds two or three times, so it should be no worse. A compiled step's loss is within
2e-2 relative of the eager one's in bf16 (Inductor reorders the elementwise rounding); in fp32 1e-5 before the
first update and 1e-3 after it.
"""

from __future__ import annotations

import pytest
import torch

from brisk.config import load_config
from brisk.models.lm import lm_loss
from brisk.plan import make_plan
from brisk.speed import llm_kernels as K

from .test_llm_kernels_cuda import ROOT, batches, model, needs_fla  # noqa: F401

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / (b.float().norm() + 1e-12))


def out_and_grads(module, inputs, weight_scale):
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    module.zero_grad(set_to_none=True)
    y = module(*inputs)
    (y.float() * weight_scale).sum().backward()
    return [y.detach()] + [x.grad for x in inputs] + [module.weight.grad]


def compare_to_fp32(make, fused_mixin, inputs):
    """(fused bf16 errors, transformers bf16 errors) against transformers' module in fp32, output and grads."""
    ref32 = make().cuda()
    ref16 = make().cuda().to(torch.bfloat16)
    with torch.no_grad():
        ref32.weight.copy_(torch.linspace(-0.5, 1.5, ref32.weight.numel()))
        ref16.weight.copy_(ref32.weight)
    fused = K.swap_class(make().cuda().to(torch.bfloat16), fused_mixin)
    fused.load_state_dict(ref16.state_dict())
    scale = torch.linspace(-1, 1, inputs[0].shape[-1], device="cuda")
    exact = out_and_grads(ref32, [x.float() for x in inputs], scale)
    plain = out_and_grads(ref16, inputs, scale)
    fast = out_and_grads(fused, inputs, scale)
    return [rel(f, e) for f, e in zip(fast, exact)], [rel(p, e) for p, e in zip(plain, exact)]


def test_fla_gated_norm_matches_transformers_in_bf16():
    needs_fla()
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    torch.manual_seed(0)
    x = torch.randn(4096, 128, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(4096, 128, device="cuda", dtype=torch.bfloat16)
    fused, plain = compare_to_fp32(lambda: Qwen3_5RMSNormGated(128, eps=1e-6), K.FlaGatedNorm, [x, gate])
    for what, f, p in zip(("out", "d_x", "d_gate", "d_weight"), fused, plain):
        assert f <= 2 * p + 1e-3, (what, f, p)


def test_liger_plus_one_norm_matches_transformers_in_bf16():
    pytest.importorskip("liger_kernel")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    torch.manual_seed(0)
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    fused, plain = compare_to_fp32(lambda: Qwen3_5RMSNorm(2048, eps=1e-6), K.LigerNormPlusOne, [x])
    for what, f, p in zip(("out", "d_x", "d_weight"), fused, plain):
        assert f <= 2 * p + 1e-3, (what, f, p)


QWEN3 = ["model.llm.config.num_hidden_layers=4"]
# Qwen3.5 2B's Gated DeltaNet heads (16 value heads, K = V = 128) in a small model: fla's Triton kernels are the
# ones bench/fla_warm.py 16 and the 2B bench arms compile (a new head count is minutes of cold compile).
QWEN3_5_2B_HEADS = ["model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 512, "
                    "intermediate_size: 1024, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, "
                    "head_dim: 64, linear_num_key_heads: 16, linear_num_value_heads: 16, linear_key_head_dim: 128, "
                    "linear_value_head_dim: 128, linear_conv_kernel_dim: 4, tie_word_embeddings: false, "
                    "layer_types: [linear_attention, full_attention, linear_attention, full_attention]}"]


@pytest.mark.parametrize("arch,dtype", [("qwen3", "bf16"), ("qwen3", "fp32"), ("qwen3_5", "bf16")])
def test_compiled_step_equals_eager(arch, dtype, batches, tmp_path, monkeypatch):  # noqa: F811
    """speed.compile (each decoder layer, Inductor, dynamic shapes) on a packed row: the losses of 3 AdamW steps
    equal the eager model's, and Dynamo compiled graphs (no silent eager fallback: compile_on_error=raise)."""
    from brisk.speed.compile import apply_compile, compile_counters
    from brisk.speed.varlen import apply_varlen_attention

    if arch == "qwen3_5":
        needs_fla()
    over = QWEN3 if arch == "qwen3" else QWEN3_5_2B_HEADS
    ref, fast = model(over, dtype), model(over, dtype)
    fast.load_state_dict(ref.state_dict())
    cfg = load_config(ROOT / "configs" / "sft_demo.yaml", [*over, "speed.compile=true", "speed.compile_on_error=raise",
                                                          f"speed.inductor_cache_dir={tmp_path}"])
    speed = make_plan(cfg, "cuda")[1].speed
    for m in (ref, fast):
        apply_varlen_attention(m.llm)
        if arch == "qwen3_5":
            K.apply_fla_linear_attention(m)
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)
    apply_compile(fast, speed, "cuda")
    _, packed = batches
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ref, fast)]
    before = compile_counters()["graphs"]
    for step in range(3):  # the first step's loss is before any update; AdamW's normalised update may then
        tol = (2e-2 if dtype == "bf16" else 1e-5 if step == 0 else 1e-3)  # move near-zero gradients' params apart
        losses = []
        for m, opt in zip((ref, fast), opts):
            loss = lm_loss(m(packed), packed.labels)[0]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        assert abs(losses[0] - losses[1]) <= tol * abs(losses[0]), (step, losses)
    assert compile_counters()["graphs"] > before
