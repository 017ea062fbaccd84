"""train.deterministic on CUDA (skipped without CUDA): an audio tower's convolution stack (Qwen3-ASR's: three
3x3 stride-2 Conv2d over 128 mel bins, GELU between) gives the same gradients bit for bit in two identical
backward passes inside the run's scope. With torch's default cuDNN settings they differed on an H100
(bench/determinism.py, conv2d2 and conv2d3 of the tiny Qwen3-ASR demo)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_conv_tower_gradients_are_the_same_in_two_passes(tmp_path):
    from brisk.config import load_config
    from brisk.speed.flags import run_scope

    cfg = load_config("configs/demo.yaml", [f"train.output_dir={tmp_path}"])
    assert cfg.train.deterministic  # the default
    torch.manual_seed(0)
    tower = torch.nn.Sequential(torch.nn.Conv2d(1, 480, 3, 2, 1), torch.nn.GELU(), torch.nn.Conv2d(480, 480, 3, 2, 1),
                                torch.nn.GELU(), torch.nn.Conv2d(480, 480, 3, 2, 1)).cuda()
    x = torch.randn(8, 1, 128, 200, device="cuda")

    def grads():
        tower.zero_grad(set_to_none=True)
        tower(x).square().mean().backward()
        return [p.grad.clone() for p in tower.parameters()]

    with run_scope(cfg):
        grads()  # algorithm choice and workspace
        a, b = grads(), grads()
    assert all(torch.equal(u, v) for u, v in zip(a, b))
