"""speed.label_head on the CPU: the LM head and loss on the labelled positions only compute the default's loss,
argmax-correct count, label count, logit statistics and gradients, in the padded and the packed layouts."""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError
from brisk.data.collate import Collator
from brisk.data.loader import build_split
from brisk.models.build import build_model
from brisk.speed.label_head import LabelHead, gather_labelled, head_loss, static_rows
from brisk.train.step import StepHooks, logit_stats, model_loss

from .conftest import run_train, speed_parts, tiny_config

CPU = torch.device("cpu")


def _batch(cfg, collator, n=6):
    split = build_split(cfg, "train", Collator(), 483)
    idx = split.sampler.batches(0)[0][:n]
    return collator([split.dataset[(i, 0)] for i in idx])


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _run(model, batch, loss_hook):
    model.zero_grad(set_to_none=True)
    first, loss, correct, count = model_loss(model, batch, StepHooks(logit_stats=True, loss=loss_hook))
    loss.backward()
    return loss.detach(), int(correct), int(count), logit_stats(first, batch.labels), _grads(model)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def test_gather_takes_exactly_the_labelled_positions():
    torch.manual_seed(0)
    labels = torch.randint(0, 50, (3, 17))
    labels[torch.rand(3, 17) < 0.6] = -100
    target = torch.cat([labels[:, 1:], torch.full((3, 1), -100)], 1).reshape(-1)
    want = (target != -100).nonzero().squeeze(1)
    n = want.numel()
    idx, tgt = gather_labelled(labels, n)
    assert torch.equal(idx, want) and torch.equal(tgt, target[want])
    idx, tgt = gather_labelled(labels, n + 5)  # static layout: padding rows are ignored rows
    assert torch.equal(idx[:n], want) and (tgt[n:] == -100).all() and torch.equal(tgt[:n], target[want])
    assert static_rows(640, 0.5) == 320 and static_rows(600, 0.25) == 192 and static_rows(100, 1.0) == 100


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_same_loss_counts_stats_and_gradients_fp32(tmp_path, layout):
    cfg = tiny_config(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0})
    model = build_model(cfg).eval()  # eval: no dropout, so two forwards compute the same thing
    col = Collator() if layout == "padded" else Collator(packed=True, token_buckets=(256, 512, 1024))
    batch = _batch(cfg, col)
    assert batch.n_label_tokens > 0
    ref = _run(model, batch, None)
    hooks = {"exact": LabelHead(),
             "static, padded rows": LabelHead(static=True, frac=1.0),
             "static, overflow -> all rows": LabelHead(static=True, frac=0.01)}
    for what, hook in hooks.items():
        loss, correct, count, stats, grads = _run(model, batch, hook)
        assert abs(loss.item() - ref[0].item()) <= 1e-6 * abs(ref[0].item()), (what, loss.item(), ref[0].item())
        assert (correct, count) == (ref[1], ref[2]) and count == batch.n_label_tokens, what
        for s, r in zip(stats, ref[3]):
            assert abs(s.item() - r.item()) <= 1e-5 * abs(r.item()), (what, s.item(), r.item())
        assert grads.keys() == ref[4].keys(), what
        for name, g in grads.items():
            assert _rel(g, ref[4][name]) <= 1e-5, (what, name, _rel(g, ref[4][name]))


def test_bf16_llm_under_autocast_within_bf16_tolerance(tmp_path):
    cfg = tiny_config(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0, "model.llm.dtype": "bf16"})
    model = build_model(cfg).eval()
    batch = _batch(cfg, Collator(packed=True, token_buckets=(256, 512, 1024)))
    ref = _run(model, batch, None)
    loss, correct, count, stats, grads = _run(model, batch, LabelHead())
    assert abs(loss.item() - ref[0].item()) <= 1e-2 * abs(ref[0].item())
    assert count == ref[2] and abs(correct - ref[1]) <= max(1, ref[2] // 50)
    assert all(abs(s.item() - r.item()) <= 1e-2 * abs(r.item()) for s, r in zip(stats, ref[3]))
    for name, g in grads.items():
        assert _rel(g, ref[4][name]) <= 5e-2, (name, _rel(g, ref[4][name]))


def test_chunks_add_up(monkeypatch):
    """Several chunks give the one-chunk result (the chunk loop is what bounds memory on long rows)."""
    import brisk.speed.label_head as lh

    torch.manual_seed(0)
    h, w = torch.randn(37, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    tgt = torch.randint(0, 50, (37,))
    tgt[::3] = -100
    one = head_loss(h, tgt, w, None, torch.float32, stats=True)
    g1 = torch.autograd.grad(one[0], (h, w))
    monkeypatch.setattr(lh, "CHUNK_ROWS", 8)
    many = head_loss(h, tgt, w, None, torch.float32, stats=True)
    g2 = torch.autograd.grad(many[0], (h, w))
    assert torch.allclose(one[0], many[0], rtol=1e-6) and int(one[1]) == int(many[1]) and int(one[2]) == 37 - 13
    assert all(torch.allclose(a, b, rtol=1e-6) for a, b in zip(one[3], many[3]))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(g1, g2))


def _saved_bytes(fn, inputs) -> int:
    """Bytes of the storages autograd keeps for the backward while ``fn`` runs, each storage once, the
    ``inputs``' own storages left out (they live anyway)."""
    own = {x.untyped_storage().data_ptr() for x in inputs}
    kept = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(kept.values()), out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recompute_gives_the_same_bits_and_keeps_one_chunk(monkeypatch, dtype):
    """speed.label_head_recompute: loss, counts, statistics and the gradients of the rows and of a trainable head
    equal the kept-chunks path bit for bit (also under a gradient-accumulation scale, which reaches the chunks
    through the backward), and the backward keeps no chunk's log-probabilities."""
    import brisk.speed.label_head as lh

    monkeypatch.setattr(lh, "CHUNK_ROWS", 16)
    torch.manual_seed(0)
    h = torch.randn(70, 32, requires_grad=True)  # 5 chunks, the last one short
    w = torch.randn(300, 32, requires_grad=True)
    tgt = torch.randint(0, 300, (70,))
    tgt[::4] = -100
    results = {}
    for recompute in (False, True):
        saved, out = _saved_bytes(lambda: head_loss(h, tgt, w, None, dtype, stats=True, recompute=recompute), (h, w))
        grads = torch.autograd.grad(out[0] * 0.25, (h, w))  # 0.25: a micro-batch of 4
        results[recompute] = (saved, out, grads)
    (s0, o0, g0), (s1, o1, g1) = results[False], results[True]
    assert torch.equal(o0[0], o1[0]) and torch.equal(o0[1], o1[1]) and torch.equal(o0[2], o1[2])
    assert all(torch.equal(a, b) for a, b in zip(o0[3], o1[3]))
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    log_probs = 70 * 300 * 4  # every chunk's fp32 log-probabilities, which cross-entropy keeps
    assert s0 >= log_probs and s1 < log_probs / 4, (s0, s1)


def test_recompute_needs_the_label_head(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.label_head": True, "speed.label_head_recompute": True})
    plan = speed_parts(build_model(cfg), cfg)[2]
    assert plan.loss.recompute and any("recomputed in the backward" in n for n in plan.notes)
    with pytest.raises(ConfigError, match="label_head_recompute"):
        speed_parts(build_model(cfg), tiny_config(tmp_path, **{"speed.label_head_recompute": True}))


def test_switch_on_and_off(tmp_path):
    cfg = tiny_config(tmp_path)
    model = build_model(cfg)
    assert speed_parts(model, cfg)[2].loss is None
    cfg = tiny_config(tmp_path, **{"speed.label_head": True})
    plan = speed_parts(build_model(cfg), cfg)[2]
    assert isinstance(plan.loss, LabelHead) and not plan.loss.static
    assert any(n.startswith("label_head:") for n in plan.notes)
    with pytest.raises(ConfigError, match="label_rows_frac"):
        tiny_config(tmp_path, **{"speed.label_rows_frac": 0.0})


def test_training_run_with_label_head(tmp_path):
    """The trainer, validation and the probe's logit statistics run through the hook."""
    out = run_train(tmp_path, **{"speed.label_head": True, "speed.packing": True, "train.max_steps": 3,
                                 "probe.enabled": True, "train.save_final": False})
    assert out["step"] == 3 and out["history"] and out["history"][-1]["tokens"] > 0
    text = (tmp_path / "probe.rank0.jsonl").read_text()
    assert '"logits_std"' in text and "speed label_head" in (tmp_path / "train.log").read_text()



def test_example_batches_fit_the_static_rows(tmp_path):
    """Graphs captured up front from synthetic batches are each bucket's common (length, static rows) graph, even
    when an example carries more labelled positions than those rows; such a batch in training gathers all rows."""
    import dataclasses

    cfg = tiny_config(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0})
    batch = _batch(cfg, Collator(packed=True, token_buckets=(256, 512, 1024)))
    t = batch.labels.numel()
    # every position labelled (the next token as target): more than the 64 static rows of frac=0.01
    over = dataclasses.replace(batch, labels=batch.input_ids.clone(), n_label_tokens=t - 1)
    hook = LabelHead(static=True, frac=0.01)
    k = static_rows(t, 0.01)
    assert over.n_label_tokens > k and hook.rows(over) == t  # as collated: the all-rows graph's key
    model = build_model(cfg).eval()
    ref, got = _run(model, over, None), _run(model, over, hook)  # the all-rows gather computes the default's loss
    assert abs(got[0].item() - ref[0].item()) <= 1e-6 * abs(ref[0].item()) and got[1:3] == ref[1:3] == (got[1], t - 1)
    fitted = hook.fit(over)
    assert hook.rows(fitted) == k and fitted.n_label_tokens == k == int((fitted.labels[:, 1:] != -100).sum())
    kept = fitted.labels[:, 1:] != -100  # the first k targets, unchanged
    assert torch.equal(fitted.labels[:, 1:][kept], over.labels[:, 1:].reshape(-1)[:k])
    assert hook.fit(fitted) is fitted and hook.fit(batch) is batch and LabelHead().fit(over) is over
