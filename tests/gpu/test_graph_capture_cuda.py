"""Capturing compiled code (brisk.speed.capture): a second call that recompiles is warmed before the capture, and a
compile left for the capture is refused by name, not by a CUDA error. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


class Router:
    """As transformers' hub-kernel router: the first compiled call flips a flag that the first graph guards on, so
    the second call compiles again; the values computed never change."""

    uses_global = False


def routed(x):
    if Router.uses_global or torch.compiler.is_compiling():
        Router.uses_global = True
    return (x * 2).sin().sum(-1)


def _fresh():
    torch._dynamo.reset()
    Router.uses_global = False
    return torch.compile(routed), torch.randn(64, 128, device="cuda")


def test_one_warm_up_leaves_a_recompile_that_the_capture_refuses_by_name():
    from brisk.speed.capture import capture_graph, on_side_stream

    fn, x = _fresh()
    on_side_stream(lambda: fn(x))  # one warm-up, as a single make-ready call would
    with pytest.raises(RuntimeError, match="(?i)recompil"):
        capture_graph(lambda: fn(x), torch.cuda.graph_pool_handle())


def test_settled_warm_ups_make_the_capture_safe_and_exact():
    from brisk.speed.capture import capture_graph, compile_events, on_side_stream, settle

    fn, x = _fresh()
    before = compile_events()
    calls = settle(lambda: on_side_stream(lambda: fn(x)))
    assert calls >= 2 and compile_events() > before  # the second call compiled again, outside any capture
    graph, out = capture_graph(lambda: fn(x), torch.cuda.graph_pool_handle())
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, (x * 2).sin().sum(-1))
