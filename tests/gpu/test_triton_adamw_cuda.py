"""speed.triton_adamw on CUDA (skipped without CUDA): brisk's Triton AdamW update equals torch's fused capturable
AdamW bit for bit (parameters, moments, step counters), with and without the clip scale and a skipped step,
eagerly and inside a CUDA graph; and a graphed run with the switch trains as the plain graphed run.

    python -m pytest tests/gpu/test_triton_adamw_cuda.py -q
"""

from __future__ import annotations

import pytest
import torch

from brisk.speed.triton_adamw import BLOCK, TritonAdamW

from .test_gpu_state import FAST, _rel, _run_steps

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# sizes of whole blocks, of a short last block, and under one block
SIZES = [(1024, 1024), (517, 301), (BLOCK,), (3, 4097 * 5), (1000,), (128,), (64, 7)]


def _pair(dtype, weight_decay):
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=dtype)) for s in SIZES]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    kw = dict(lr=torch.tensor(3e-3, device="cuda"), betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay,
              fused=True, capturable=True)
    return a, b, torch.optim.AdamW(a, **kw), TritonAdamW(b, **kw)


def _grads(params, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(p.shape, device="cuda", dtype=p.dtype, generator=g) * 1e-2 for p in params]


def _step(opt, params, grads, scale, found):
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.grad_scale, opt.found_inf = scale, found
    try:
        opt.step()
    finally:
        del opt.grad_scale, opt.found_inf


def _mismatch(ref_opt, ref_params, opt, params) -> list[str]:
    out = []
    for i, (p, q) in enumerate(zip(ref_params, params)):
        if not torch.equal(p, q):
            out.append(f"param {i} {tuple(p.shape)}: {int((p != q).sum())} elements differ")
        sa, sb = ref_opt.state[p], opt.state[q]
        for k in ("exp_avg", "exp_avg_sq", "step"):
            if not torch.equal(sa[k], sb[k]):
                out.append(f"{k} {i} {tuple(p.shape)}: {int((sa[k] != sb[k]).sum())} elements differ")
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weight_decay", [0.01, 0.0])
def test_triton_update_equals_torch_fused_bit_for_bit(dtype, weight_decay):
    a, b, ref, opt = _pair(dtype, weight_decay)
    scales = [None, torch.tensor(1.0, device="cuda"), torch.tensor(3.7, device="cuda"), torch.tensor(2.0, device="cuda")]
    founds = [torch.zeros((), device="cuda"), torch.zeros((), device="cuda"), torch.ones((), device="cuda"), None]
    for k, (scale, found) in enumerate(zip(scales, founds)):  # the first step makes the state (torch's own step)
        grads = _grads(a, k)
        _step(ref, a, grads, scale, found)
        _step(opt, b, grads, scale, found)
        assert not _mismatch(ref, a, opt, b), (k, _mismatch(ref, a, opt, b)[:6])
        if not (found is not None and found.item() == 1):
            for p, g in zip(b, grads):  # brisk's kernel leaves the gradients as they were
                assert torch.equal(p.grad, g)
    assert int(opt.state[b[0]]["step"]) == 3  # four steps, one skipped
    assert not torch.equal(a[0], _pair(dtype, weight_decay)[0][0])  # the parameters moved


def test_triton_update_inside_a_cuda_graph_equals_torch_fused_eagerly():
    a, b, ref, opt = _pair(torch.bfloat16, 0.01)
    scale = torch.tensor(1.5, device="cuda")
    found = torch.zeros((), device="cuda")
    _step(ref, a, _grads(a, 0), scale, found)
    _step(opt, b, _grads(b, 0), scale, found)  # makes the state before the capture
    static = [torch.zeros_like(p) for p in b]
    for p, g in zip(b, static):
        p.grad = g
    opt.grad_scale, opt.found_inf = scale, found
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph):
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    del opt.grad_scale, opt.found_inf
    for k in (1, 2, 3):
        grads = _grads(a, k)
        ref.param_groups[0]["lr"].fill_(1e-3 * k)  # the schedule writes the device lr between replays
        opt.param_groups[0]["lr"].fill_(1e-3 * k)
        _step(ref, a, grads, scale, found)
        for s, g in zip(static, grads):
            s.copy_(g)
        graph.replay()
        torch.cuda.synchronize()
        assert not _mismatch(ref, a, opt, b), (k, _mismatch(ref, a, opt, b)[:6])


def test_graphed_run_with_triton_adamw_trains_as_the_plain_graphed_run():
    la, pa = _run_steps(FAST, 8)
    lb, pb = _run_steps(FAST + ["speed.triton_adamw=true"], 8)
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3
    assert max(_rel(pa[k], pb[k]) for k in pa) < 1e-2
    assert len(set(la)) > 1  # the steps did train
