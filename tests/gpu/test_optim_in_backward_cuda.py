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
    model = build_model(cfg, "cuda").train()
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


def test_graphed_resume_clips_by_the_saved_norm(tmp_path):
    """speed.clip_by_previous_norm in a graphed run: the checkpoint's norm is restored after the resumed run's
    graph capture (whose warm-ups must not leave theirs), and the resumed run trains like the uninterrupted one."""
    import json
    import shutil

    from brisk.train.run import build_trainer, train

    from .test_gpu_state import RUN, _cfg, _ckpt, _trainable

    common = RUN + FAST + ["speed.optimizer_in_backward=true", "speed.clip_by_previous_norm=true",
                           "optim.grad_clip=0.05", "train.max_steps=6", "train.save_every=3", "train.keep_n=5"]
    one, two = tmp_path / "one", tmp_path / "two"
    train(_cfg(*common, f"train.output_dir={one}"))
    saved = _ckpt(one, 3)["trainer"]["clip_norm"]
    assert saved > 0.05  # every step after the first was clipped
    (two / "checkpoints").mkdir(parents=True)
    for f in [one / "checkpoints" / "ckpt-00000003.pt", *(one / "checkpoints").glob("frozen-*.pt")]:
        shutil.copy(f, two / "checkpoints")
    (two / "checkpoints" / "index.json").write_text(json.dumps({"ckpt-00000003.pt": {"step": 3}}))
    trainer = build_trainer(_cfg(*common, f"train.output_dir={two}", "train.resume=true"))
    assert trainer.in_backward.previous_norm() == saved  # after the capture's warm-ups
    trainer.fit()
    a, b = _ckpt(one, 6)["state_dict"], _ckpt(two, 6)["state_dict"]
    keys = _trainable(a)
    assert max(_rel(a[k], b[k]) for k in keys) < 1e-2  # bf16 graphs: run-to-run atomics only


def test_graphed_label_head_recompute_trains_like_keeping_the_chunks():
    """speed.label_head_recompute inside the captured step (its checkpoints recompute in the graph's backward):
    the same losses and parameters as label_head alone."""
    base = FAST + ["speed.label_head=true"]
    la, pa = _run_steps(base, 6)
    lb, pb = _run_steps(base + ["speed.label_head_recompute=true"], 6)
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3
    assert max(_rel(pa[k], pb[k]) for k in pa) < 1e-3
