"""The Gated DeltaNet kernel check's reference and harness on the CPU: the fp32/fp64 per-token recurrence
equals transformers' own recurrent and chunked torch functions, keeps the conversations of a packed row apart,
and the check passes the torch path and flags a kernel with a wrong gradient."""

from __future__ import annotations

import pytest
import torch

from brisk.diagnose import gdn_check as G


def _inputs(b=2, t=70, h=3, kd=16, vd=8, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, t, h, kd, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(b, t, h, vd, generator=gen, dtype=dtype)
    g = -torch.rand(b, t, h, generator=gen, dtype=dtype) * 2
    beta = torch.rand(b, t, h, generator=gen, dtype=dtype)
    return q, k, v, g, beta


def _transformers(name):
    import inspect

    from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    return inspect.unwrap(getattr(m, name))


def test_reference_equals_transformers_recurrent_and_chunked_functions():
    q, k, v, g, beta = _inputs()
    ours = G.gated_delta_rule_reference(q, k, v, g, beta, segment=16)
    recurrent = _transformers("torch_recurrent_gated_delta_rule")(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]
    chunked = G.torch_chunk_function()(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]
    # transformers computes in fp32 whatever the input dtype: agreement to fp32 precision
    assert (ours - recurrent).abs().max() < 1e-5
    assert (ours - chunked).abs().max() < 1e-5
    assert ours.abs().max() > 0.1


def test_varlen_reference_keeps_conversations_apart_and_segments_do_not_change_gradients():
    lengths = (5, 64, 1, 30)
    q, k, v, g, beta = (x[:1] for x in _inputs(b=1, t=sum(lengths)))
    row = G.varlen_reference(q, k, v, g, beta, lengths, dtype=torch.float64)
    start = 0
    for n in lengths:
        alone = G.gated_delta_rule_reference(*(x[:, start:start + n] for x in (q, k, v, g, beta)))
        assert torch.allclose(row[:, start:start + n], alone, atol=1e-12)
        start += n
    grads = []
    for segment in (7, 1000):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        G.gated_delta_rule_reference(*xs, segment=segment).pow(2).sum().backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-10) and a.abs().max() > 0


def test_conv_reference_is_causal_per_conversation():
    lengths = (3, 10)
    x = torch.randn(1, 13, 6, dtype=torch.float64)
    w = torch.randn(6, 4, dtype=torch.float64)
    y = G.conv_reference(x, w, lengths, dtype=torch.float64)
    y2 = G.conv_reference(torch.cat([x[:, :3], x[:, 3:] * 0 + 5], 1), w, lengths, dtype=torch.float64)
    assert torch.equal(y[:, :3], y2[:, :3])  # the second conversation never reaches the first
    first = G.conv_reference(x[:, 3:], w, (10,), dtype=torch.float64)
    assert torch.allclose(y[:, 3:], first)  # the second starts from zeros


@pytest.mark.parametrize("shape", G.CPU_SHAPES, ids=lambda s: s.name)
def test_check_passes_the_torch_path_and_flags_a_wrong_gradient(shape):
    rows = G.check_delta_rule(shape, "cpu", kernel="torch_chunk")
    assert [r.tensor for r in rows] == ["o", "dq", "dk", "dv", "dg", "dbeta"] and all(r.ok for r in rows)
    assert all(0 < r.floor < 0.05 for r in rows)

    def dk_wrong_by_half(q, k, v, g, beta):  # right values, dk 1.5x: a backward bug like fla issue 640's
        k = k + 0.5 * (k - k.detach())
        return G.torch_chunk_varlen(q, k, v, g, beta, shape.lengths, shape.padded)

    bad = {r.tensor: r for r in G.check_delta_rule(shape, "cpu", kernel=dk_wrong_by_half)}
    assert not bad["dk"].ok and bad["dk"].rel > 0.3
    assert bad["o"].ok and bad["dv"].ok
    assert "**NO**" in G.table(list(bad.values()))


def test_conv_check_with_the_torch_conv_on_the_cpu():
    shape = G.CPU_SHAPES[0]

    def torch_conv(x, weight):
        return G.conv_reference(x, weight, shape.lengths, dtype=x.dtype)

    rows = G.check_conv(shape, "cpu", kernel=torch_conv)
    assert [r.tensor for r in rows] == ["o", "dx", "dweight"] and all(r.ok for r in rows)
