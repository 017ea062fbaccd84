"""speed.liger on the speech-LLM's Qwen3 decoder (CPU, liger's kernels replaced by the same arithmetic in torch:
tests/test_chat_model.fake_liger): every RMSNorm and SwiGLU MLP is swapped, the state dict is unchanged, the
loss and gradients are the plain ones, and with speed.fuse_projections the MLP keeps its one gate/up GEMM.
(liger's Triton kernels against the eager modules: tests/gpu/test_speech_liger_cuda.py.)"""

from __future__ import annotations

import pytest
import torch

from brisk.speed.fuse import apply_fuse_projections
from brisk.speed.llm_kernels import LigerMLP, apply_liger_kernels

from .test_chat_model import fake_liger
from .test_fuse_projections import _loss_and_grads, _model_and_batch


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused_projections"])
def test_liger_on_the_speech_decoder_keeps_the_numbers(tmp_path, monkeypatch, fuse):
    fake_liger(monkeypatch)
    cfg, model, batch = _model_and_batch(tmp_path)
    keys = list(model.state_dict())
    loss0, grads0 = _loss_and_grads(model, batch)
    if fuse:
        apply_fuse_projections(model.llm)
    note = apply_liger_kernels(model)
    layers = cfg.model.llm.config["num_hidden_layers"]
    assert note.startswith(f"liger: {4 * layers + 1} RMSNorms and {layers} SwiGLU MLPs"), note  # 2 + q/k norms a layer
    assert list(model.state_dict()) == keys
    calls = []
    mlp = model.llm.model.layers[0].mlp
    assert isinstance(mlp, LigerMLP)
    mlp.gate_proj.register_forward_hook(lambda *a: calls.append("gate"))
    loss1, grads1 = _loss_and_grads(model, batch)
    assert calls == ([] if fuse else ["gate"])  # fused: gate and up from the one concatenated GEMM
    assert abs(loss0 - loss1) <= 1e-5 * abs(loss0)
    for n in grads0:
        assert torch.allclose(grads0[n], grads1[n], rtol=1e-4, atol=1e-6), n


def test_speech_config_takes_liger(tmp_path):
    from .conftest import tiny_config

    cfg = tiny_config(tmp_path, **{"speed.liger": True})
    assert cfg.speed.liger
