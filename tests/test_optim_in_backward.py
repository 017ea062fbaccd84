"""speed.optimizer_in_backward on the CPU: the layers' updates issued from the gradient hooks give the plain
fused AdamW step's parameters, optimizer state and metrics bit for bit (clipping off); clipping by the previous
step's norm, the non-finite skip from the first bad layer down, gradient accumulation, a resume across the
switch, and the plan's refusals. (The side streams and CUDA graphs: tests/gpu/test_optim_in_backward_cuda.py.)"""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError
from brisk.data.collate import collator_for
from brisk.data.loader import build_split
from brisk.models.build import build_model
from brisk.plan import make_plan
from brisk.families import family_of
from brisk.speed.optim_in_backward import apply_optimizer_in_backward, layer_buckets
from brisk.train.optim import WarmupLR, build_optimizer, load_optimizer_state, trainable_params
from brisk.train.step import StepHooks, TrainStep

from .conftest import run_train, speed_parts, tiny_config


def _batches(cfg, n=4):
    collator = collator_for(cfg)
    split = build_split(cfg, "train", collator, 483)
    return [collator([split.dataset[(i, 0)] for i in idx]) for idx in split.sampler.batches(0)[:n]]


def _step(cfg, *, in_backward: bool, clip: float = 0.0, state: tuple | None = None):
    """A fused-AdamW TrainStep on a fresh tiny model (the same init each time), with or without the updater;
    ``state``: (model state, optimizer state) to start from."""
    torch.manual_seed(0)
    model = build_model(cfg).train()
    speed_parts(model, cfg)
    opt = build_optimizer(model, cfg.optim, fused=True)
    schedule = WarmupLR(opt, 1e-2, 2)
    params = trainable_params(model)
    hooks = StepHooks(grad_groups={id(p): i % 3 for i, p in enumerate(params)})
    if in_backward:
        hooks.in_backward, _ = apply_optimizer_in_backward(family_of(cfg).decoder_layers(model), opt, params, clip)
    if state is not None:  # after the updater: loading replaces the optimizer's group dicts, which it must follow
        model.load_state_dict(state[0])
        load_optimizer_state(opt, state[1])
        schedule.load_state_dict(state[2])
    step = TrainStep(model, opt, schedule, grad_clip=0.0 if in_backward else clip, on_device_skip=True, hooks=hooks)
    return model, opt, step


def _run(step, batches, accum: int = 1, seed: int = 0) -> list[dict]:
    out = []
    for i in range(0, len(batches), accum):
        torch.manual_seed(seed + i)  # the same dropout in both arms
        out.append(step(batches[i:i + accum]))
    return out


def _assert_same(a, b):
    (ma, oa, _), (mb, ob, _) = a, b
    for (n, p), q in zip(ma.named_parameters(), mb.parameters()):
        assert torch.equal(p, q), n
    sa, sb = oa.state_dict(), ob.state_dict()
    assert list(sa["state"]) == list(sb["state"]) and sa["param_groups"] == sb["param_groups"]
    for k in sa["state"]:
        assert sa["state"][k].keys() == sb["state"][k].keys()
        for name in sa["state"][k]:
            assert torch.equal(sa["state"][k][name], sb["state"][k][name]), (k, name)


def test_layer_updates_equal_the_plain_fused_step_bit_for_bit(tmp_path):
    cfg = tiny_config(tmp_path)
    batches = _batches(cfg)
    plain, mine = _step(cfg, in_backward=False), _step(cfg, in_backward=True)
    ib = mine[2].hooks.in_backward
    assert len(ib.buckets) == cfg.model.llm.config["num_hidden_layers"] and ib.rest  # embedding, norms, encoder
    issued = []
    original = ib._issue
    ib._issue = lambda k: (issued.append(k), original(k))  # test-only spy on the instance
    ma, mb = _run(plain[2], batches), _run(mine[2], batches)
    # every layer was issued from its hooks, in backward order (last layer first), once a step
    assert issued == list(range(len(ib.buckets))) * len(batches)
    for a, b in zip(ma, mb):
        assert a.keys() == b.keys() and "module_norms" in a
        for k in a:
            assert torch.equal(a[k], b[k]), k
    _assert_same(plain, mine)
    assert float(ma[-1]["grad_norm"]) > 0 and not any(float(m["skipped"]) for m in mb)


def test_gradient_accumulation_updates_after_the_last_micro_batch_only(tmp_path):
    cfg = tiny_config(tmp_path)
    batches = _batches(cfg, 4)
    plain, mine = _step(cfg, in_backward=False), _step(cfg, in_backward=True)
    _run(plain[2], batches, accum=2)
    _run(mine[2], batches, accum=2)
    _assert_same(plain, mine)
    assert int(mine[1].state_dict()["state"][0]["step"]) == 2


def test_clip_by_previous_norm(tmp_path):
    """Each step clips by the previous step's global norm (none at the first step): the plain fused step given
    that scale by hand is the reference."""
    cfg = tiny_config(tmp_path)
    batches = _batches(cfg, 3)
    clip = 0.05  # well under the tiny model's norms: every step after the first is clipped
    model, opt, step = _step(cfg, in_backward=True, clip=clip)
    ref_model, ref_opt, ref = _step(cfg, in_backward=False)
    previous = None
    for i, b in enumerate(batches):
        torch.manual_seed(i)
        m = step([b])
        torch.manual_seed(i)
        ref.optimizer.zero_grad(set_to_none=True)
        from brisk.train.step import model_loss

        _, loss, _, _ = model_loss(ref_model, b, ref.hooks)
        loss.backward()
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in ref.params])))
        ref_opt.found_inf = torch.zeros(())
        ref_opt.grad_scale = torch.ones(()) if previous is None else torch.clamp((previous + 1e-6) / clip, min=1.0)
        ref_opt.step()
        del ref_opt.found_inf, ref_opt.grad_scale
        ref.advance(m)
        assert torch.equal(m["grad_norm"], norm)  # the norm before clipping
        previous = norm
        assert float(norm) > clip
    _assert_same((model, opt, step), (ref_model, ref_opt, ref))


def test_a_non_finite_layer_skips_itself_and_the_layers_below(tmp_path):
    cfg = tiny_config(tmp_path)
    model, opt, step = _step(cfg, in_backward=True)
    ib = step.hooks.in_backward
    bad = ib.buckets[1][0]  # a parameter of the second layer from the top
    handle = bad.register_hook(lambda g: g * float("nan"))
    before = {id(p): p.detach().clone() for p in step.params}
    metrics = step(_batches(cfg, 1))
    handle.remove()
    assert float(metrics["skipped"]) == 1.0 and not torch.isfinite(metrics["grad_norm"])
    changed = {id(p): not torch.equal(p, before[id(p)]) for p in step.params}
    assert all(changed[id(p)] for p in ib.buckets[0])  # the top layer's backward came first: updated
    for b in ib.buckets[1:]:
        assert not any(changed[id(p)] for p in b)  # the bad layer and those below: skipped
    assert not any(changed[id(p)] for p in ib.rest)  # the last bucket: the global flag
    steps = {id(p): int(opt.state[p]["step"]) for p in step.params}
    assert all(steps[id(p)] == 1 for p in ib.buckets[0]) and all(steps[id(p)] == 0 for p in ib.rest)


def test_resume_across_the_switch(tmp_path):
    """Two plain steps, saved; two more with the switch on from the saved state equal four plain steps."""
    cfg = tiny_config(tmp_path)
    batches = _batches(cfg, 4)
    plain = _step(cfg, in_backward=False)
    _run(plain[2], batches[:2])
    saved = ({k: v.clone() for k, v in plain[0].state_dict().items()}, plain[1].state_dict(),
             plain[2].schedule.state_dict())
    import copy

    saved = copy.deepcopy(saved)
    _run(plain[2], batches[2:], seed=2)
    mine = _step(cfg, in_backward=True, state=saved)
    _run(mine[2], batches[2:], seed=2)
    _assert_same(plain, mine)


def test_hooks_only_act_when_armed(tmp_path):
    """A backward outside the step (e.g. a FLOP count) does not update anything."""
    cfg = tiny_config(tmp_path)
    model, opt, step = _step(cfg, in_backward=True)
    before = [p.detach().clone() for p in step.params]
    from brisk.train.step import model_loss

    _, loss, _, _ = model_loss(model, _batches(cfg, 1)[0], step.hooks)
    loss.backward()
    assert all(torch.equal(p, q) for p, q in zip(step.params, before)) and not opt.state


def test_buckets_are_the_decoder_layers_last_first(tmp_path):
    cfg = tiny_config(tmp_path)
    model = build_model(cfg)
    params = trainable_params(model)
    buckets = layer_buckets(family_of(cfg).decoder_layers(model), params)
    layers = list(model.llm.model.layers)
    assert [set(map(id, b)) for b in buckets] == [set(map(id, layer.parameters())) for layer in reversed(layers)]


# ------------------------------------------------------------------------------------------ the plan
def test_off_by_default_registers_nothing(tmp_path):
    cfg = tiny_config(tmp_path)
    assert not cfg.speed.optimizer_in_backward and not cfg.speed.clip_by_previous_norm
    model = build_model(cfg)
    speed_parts(model, cfg)
    assert all(p._post_accumulate_grad_hooks is None for p in model.parameters())


@pytest.mark.parametrize("extra, words", [
    ({"speed.optimizer_in_backward": True, "optim.grad_clip": 0}, "set speed.fused_adamw=true"),
    ({"speed.optimizer_in_backward": True, "speed.fused_adamw": True, "optim.grad_clip": 5.0},
     "speed.clip_by_previous_norm=true"),
    ({"speed.clip_by_previous_norm": True}, "belongs to speed.optimizer_in_backward"),
])
def test_plan_refusals(tmp_path, extra, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        tiny_config(tmp_path, **extra)


def test_plan_refuses_several_ranks(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.optimizer_in_backward": True, "speed.fused_adamw": True,
                                   "optim.grad_clip": 0})
    with pytest.raises(ConfigError, match="with 2 ranks"):
        make_plan(cfg, "cpu", 2)
    _, plan = make_plan(cfg, "cpu", 1)
    assert "optimizer_in_backward" in plan.on


def test_a_run_with_the_switch_trains_and_logs_it(tmp_path, capsys):
    run_train(tmp_path, **{"speed.optimizer_in_backward": True, "speed.fused_adamw": True,
                           "speed.clip_by_previous_norm": True, "optim.grad_clip": 1.0, "train.max_steps": 3})
    out = capsys.readouterr().out
    assert "switches=fused_adamw,optimizer_in_backward" in out
    assert "optimizer_in_backward: 2 decoder layers (22 tensors)" in out and "step 3 (epoch" in out


def test_resume_with_clip_by_previous_norm_is_exact(tmp_path):
    """6 steps in one run == 3 steps, resume, 3 more, with every step after the first clipped by the previous
    step's norm: the checkpoint keeps that norm (a resume that dropped it would not clip its first step)."""
    from brisk.models.build import read_checkpoint

    extra = {"speed.optimizer_in_backward": True, "speed.fused_adamw": True, "speed.clip_by_previous_norm": True,
             "optim.grad_clip": 0.05, "train.max_steps": 6}  # 0.05: well under the tiny model's norms
    run_train(tmp_path / "one", **extra)
    run_train(tmp_path / "two", **{**extra, "train.max_steps": 3})
    mid = read_checkpoint(tmp_path / "two" / "checkpoints" / "ckpt-00000003.pt")
    assert mid["trainer"]["clip_norm"] > 0.05
    run_train(tmp_path / "two", **{**extra, "train.resume": True})
    a, b = (read_checkpoint(tmp_path / d / "checkpoints" / "ckpt-00000006.pt") for d in ("one", "two"))
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    assert a["trainer"]["clip_norm"] == b["trainer"]["clip_norm"]


def test_on_it_adds_hooks_only(tmp_path):
    """With the switch on the model is untouched (no method shadowed, the same state dict keys); the updater's
    only trace is one gradient hook a decoder-layer parameter, which ``remove`` takes off."""
    from .test_speed import _replaced_forwards

    cfg = tiny_config(tmp_path)
    plain_keys = list(build_model(cfg).state_dict())
    model, opt, step = _step(cfg, in_backward=True)
    ib = step.hooks.in_backward
    assert _replaced_forwards(model) == [] and list(model.state_dict()) == plain_keys
    hooked = [p for p in model.parameters() if p._post_accumulate_grad_hooks]
    assert {id(p) for p in hooked} == {id(p) for b in ib.buckets for p in b}
    ib.remove()
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())


def test_a_layer_parameter_without_a_gradient(tmp_path):
    """A layer whose hooks do not all fire (one of its parameters gets no gradient) is updated after the backward
    with the rest: still the plain step's numbers, norms included."""
    cfg = tiny_config(tmp_path)
    batches = _batches(cfg, 3)
    plain, mine = _step(cfg, in_backward=False), _step(cfg, in_backward=True)
    name = "llm.model.layers.1.mlp.up_proj.weight"
    for model, _, _ in (plain, mine):
        dict(model.named_parameters())[name].requires_grad_(False)  # still in the optimizer, no gradient
    ma, mb = _run(plain[2], batches), _run(mine[2], batches)
    for a, b in zip(ma, mb):
        for k in a:
            assert torch.equal(a[k], b[k]), k
    _assert_same(plain, mine)
    assert dict(mine[0].named_parameters())[name] not in mine[1].state


def test_a_chat_model_updates_equal_the_plain_fused_step_bit_for_bit(tmp_path):
    """model.family causal_lm (the tiny Qwen3 of the chat demo, packed rows): its decoder layers are the buckets
    and the rest (embedding, final norm, LM head) the last one; the same bits as the plain fused step."""
    from brisk.config import load_config

    from .conftest import REPO

    cfg = load_config(REPO / "configs" / "sft_demo.yaml", [f"train.output_dir={tmp_path}", "speed.packing=true",
                                                            "speed.fused_adamw=true", "speed.optimizer_in_backward=true",
                                                            "speed.clip_by_previous_norm=true"])
    batches = _batches(cfg)
    plain, mine = _step(cfg, in_backward=False), _step(cfg, in_backward=True)
    ib = mine[2].hooks.in_backward
    assert len(ib.buckets) == cfg.model.llm.config["num_hidden_layers"] and ib.rest
    ma, mb = _run(plain[2], batches), _run(mine[2], batches)
    for a, b in zip(ma, mb):
        for k in a:
            assert torch.equal(a[k], b[k]), k
    _assert_same(plain, mine)


def test_tensor_norms_equal_the_per_tensor_cast_bit_for_bit():
    """The step's per-tensor norms are stacked in the gradients' dtype and cast once (one kernel, not one a
    parameter): the same bits as casting each norm first, for bf16, fp32 and a mix of both."""
    from brisk.speed.grad_norms import tensor_norms

    g = torch.Generator().manual_seed(0)
    bf16 = [torch.randn(n, generator=g).bfloat16() * 3 for n in (7, 128, 1024, 1)]
    fp32 = [torch.randn(n, generator=g) for n in (5, 300)]
    for ts in (bf16, fp32, bf16 + fp32, fp32 + bf16):
        old = torch.stack([t.float() for t in torch._foreach_norm(ts)])
        new = tensor_norms(ts)
        assert new.dtype == torch.float32 and torch.equal(new, old)
