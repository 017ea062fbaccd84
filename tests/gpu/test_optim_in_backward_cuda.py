"""speed.optimizer_in_backward on CUDA (skipped without CUDA): the layers' updates, issued on side streams from
the gradient hooks, equal torch's fused capturable AdamW step on the same gradients bit for bit; inside the
graphed step (captured with its side streams) a run trains like the plain graphed step.

    python -m pytest tests/gpu/test_optim_in_backward_cuda.py -q
"""

from __future__ import annotations

import copy

import pytest
import torch

from brisk.models.build import build_model
from brisk.families import family_of
from brisk.speed.optim_in_backward import apply_optimizer_in_backward
from brisk.train.optim import WarmupLR, build_optimizer, trainable_params
from brisk.train.step import StepHooks, TrainStep

from ..conftest import speed_parts, tiny_config
from .test_gpu_state import FAST, _rel, _run_steps

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_side_stream_updates_equal_the_fused_step_on_the_same_gradients(tmp_path):
    from brisk.data.collate import collator_for
    from brisk.data.loader import build_split

    cfg = tiny_config(tmp_path, **{"train.device": "cuda", "speed.fused_adamw": True})
    torch.manual_seed(0)
    model = build_model(cfg.model, "cuda").train()
    twin = copy.deepcopy(model)
    speed_parts(model, cfg, "cuda")
    opt = build_optimizer(model, cfg.optim, fused=True, capturable=True)
    ref = build_optimizer(twin, cfg.optim, fused=True, capturable=True)
    params, ref_params = trainable_params(model), trainable_params(twin)
    schedule, ref_schedule = WarmupLR(opt, 1e-2, 2), WarmupLR(ref, 1e-2, 2)
    ib, _ = apply_optimizer_in_backward(family_of(cfg).decoder_layers(model), opt, params, 0.0)
    assert ib.update_stream is not None and len(ib.buckets) == 2
    step = TrainStep(model, opt, schedule, grad_clip=0.0, on_device_skip=True, hooks=StepHooks(in_backward=ib))
    collator = collator_for(cfg)
    split = build_split(cfg, "train", collator, 483)
    for idx in split.sampler.batches(0)[:4]:
        metrics = step([collator([split.dataset[(i, 0)] for i in idx]).to("cuda")])
        # the twin takes the plain fused step on the very gradients the layers were updated with
        for p, q in zip(params, ref_params):
            q.grad = p.grad.clone()
        ref.found_inf = torch.zeros((), device="cuda")
        ref.step()
        del ref.found_inf
        ref_schedule.step()
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in params])))
        assert torch.equal(metrics["grad_norm"], norm) and float(metrics["skipped"]) == 0.0
        for p, q in zip(params, ref_params):
            assert torch.equal(p, q)
    for p, q in zip(params, ref_params):
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][k], ref.state[q][k]), k


def test_graphed_step_with_the_updates_in_the_backward_trains_like_the_plain_one():
    """The step graphs captured with the side streams: the same losses and parameters as the plain graphed
    step (bf16 LLM; the kernels are the same, only run-to-run atomics differ)."""
    base = FAST + ["speed.fresh_grads=true", "optim.grad_clip=0"]
    la, pa = _run_steps(base, 8)
    lb, pb = _run_steps(base + ["speed.optimizer_in_backward=true"], 8)
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3
    assert max(_rel(pa[k], pb[k]) for k in pa) < 1e-3
    assert len(set(la)) > 1
