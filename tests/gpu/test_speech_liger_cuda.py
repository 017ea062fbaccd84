"""speed.liger on the speech-LLM's decoder on CUDA (skipped without CUDA or liger-kernel): liger's fused
RMSNorm and SwiGLU Triton kernels, alone and on the fused gate/up GEMM (speed.fuse_projections), give the eager
modules' loss and gradients (bf16 LLM: the tolerances of the fused projections' GPU test).

    python -m pytest tests/gpu/test_speech_liger_cuda.py -q
"""

from __future__ import annotations

import pytest
import torch

from brisk.models.build import build_model
from brisk.speed.fuse import apply_fuse_projections
from brisk.speed.llm_kernels import available
from brisk.train.step import StepHooks, model_loss

from .test_gpu_state import _cfg, _rel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not available("liger_kernel"), reason="needs liger-kernel")]


def _loss_grads(model, batch):
    model.zero_grad(set_to_none=True)
    _, loss, _, _ = model_loss(model, batch, StepHooks())
    loss.backward()
    return loss.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused_projections"])
def test_liger_speech_decoder_matches_the_eager_modules(fuse):
    from brisk.bench.harness import sample_stream
    from brisk.data.collate import collator_for
    from brisk.speed.llm_kernels import apply_liger_kernels

    cfg = _cfg("speed.packing=true")
    torch.manual_seed(0)
    model = build_model(cfg, "cuda").eval()  # no dropout: two forwards compare
    batch = collator_for(cfg)(next(iter(sample_stream(cfg, 1, 4096)))).to("cuda")
    l0, g0 = _loss_grads(model, batch)
    if fuse:
        apply_fuse_projections(model.llm)
    note = apply_liger_kernels(model)
    assert "SwiGLU MLPs" in note
    l1, g1 = _loss_grads(model, batch)
    assert abs(float(l0 - l1)) <= 2e-3 * abs(float(l0)), (float(l0), float(l1))
    assert g0.keys() == g1.keys()
    assert max(_rel(g0[n], g1[n]) for n in g0) < 2e-2
