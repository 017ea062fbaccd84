"""speed.fresh_grads is a CUDA-graph option: off by default, refused without cuda_graph (the graphed path itself
is checked on the GPU in tests/gpu/test_label_head_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError

from .conftest import speed_parts, tiny_config


def test_fresh_grads_is_off_by_default_and_needs_cuda_graph(tmp_path):
    assert tiny_config(tmp_path).speed.fresh_grads is False
    with pytest.raises(ConfigError, match="speed.fresh_grads needs speed.cuda_graph"):
        tiny_config(tmp_path, **{"speed.fresh_grads": True})


def test_fresh_grads_refused_with_several_ranks(tmp_path):
    """Several ranks average gradients in flat persistent buffers (GradSync) that fresh gradients would bypass:
    the plan refuses it before any model or collective exists."""
    from brisk.plan import make_plan

    cfg = tiny_config(tmp_path, **{"speed.packing": True, "speed.cuda_graph": True, "speed.fresh_grads": True,
                                   "speed.frozen_eval": True, "model.encoder.freeze": True, "model.adaptor.freeze": True})
    make_plan(cfg, "cuda", 1)  # one rank: fine
    with pytest.raises(ConfigError, match="speed.fresh_grads with 2 ranks"):
        make_plan(cfg, "cuda", 2)


def test_body_with_persistent_or_fresh_gradients_computes_the_same_numbers(tmp_path):
    """The one step body's two ways to start from no gradients (what speed.fresh_grads switches under the graphs):
    zeroed persistent buffers that backward adds into, or none (backward hands over new tensors): 0 + g == g."""
    from brisk.data.loader import build_split
    from brisk.models.build import build_model
    from brisk.data.collate import collator_for
    from brisk.train.optim import WarmupLR, build_optimizer
    from brisk.train.step import StepHooks, TrainStep

    cfg = tiny_config(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0, "fun_asr_nano.encoder.dropout_rate": 0.0})
    out = {}
    for persistent in (True, False):
        torch.manual_seed(0)
        model = build_model(cfg).train()
        plan = speed_parts(model, cfg)[2]
        opt = build_optimizer(model, cfg.optim)
        step = TrainStep(model, opt, WarmupLR(opt, cfg.optim.lr, 2), grad_clip=1.0, persistent_grads=persistent,
                         hooks=StepHooks(audio=plan.audio))
        if persistent:  # as GraphedStep sets it up without speed.fresh_grads
            for p in step.params:
                p.grad = torch.zeros_like(p)
        collator = collator_for(cfg)
        split = build_split(cfg, "train", collator, 483)
        losses = [step([collator([split.dataset[(i, 0)] for i in idx])])["loss"].item()
                  for idx in split.sampler.batches(0)[:3]]
        out[persistent] = losses, {n: p.detach().clone() for n, p in model.named_parameters()}
        assert all(p.grad is not None for p in step.params) if persistent else True
    assert out[True][0] == out[False][0]
    assert all(torch.equal(out[True][1][n], out[False][1][n]) for n in out[True][1])
