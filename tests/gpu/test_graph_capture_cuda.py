"""Capturing compiled code (brisk.speed.capture): a call that still compiles is warmed before the capture, and a
compile left for the capture is refused by name, not by a CUDA error. Needs CUDA.

The second call compiling again is made certain here by a new input shape (Dynamo's automatic dynamic shapes:
the first shape compiles a static graph, a second one a dynamic graph). In a run the cause can be a global the
first compiled call writes, or a graph loaded from the cache at its second call: the capture code does not care
why, only whether a warm-up compiled."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def f(x):
    return (x * 2).sin().sum(-1)


def _fresh():
    torch._dynamo.reset()
    return torch.compile(f), torch.randn(64, 128, device="cuda"), torch.randn(32, 128, device="cuda")


def test_a_compile_left_for_the_capture_is_refused_by_name():
    from brisk.speed.capture import capture_graph, on_side_stream

    fn, first, other = _fresh()
    on_side_stream(lambda: fn(first))  # one warm-up, of another shape: the capture's call must compile
    with pytest.raises(RuntimeError, match="(?i)recompil"):
        capture_graph(lambda: fn(other), torch.cuda.graph_pool_handle())


def test_settled_warm_ups_make_the_capture_safe_and_exact():
    from brisk.speed.capture import capture_graph, compile_events, on_side_stream, settle

    fn, first, other = _fresh()
    seen = []

    def warm():  # the first call sees another shape, as a bucket's first batch after a different one
        seen.append(compile_events())
        on_side_stream(lambda: fn(first if len(seen) == 1 else other))

    calls = settle(warm)
    after = compile_events()
    assert calls == 3, calls  # call 1 compiled, call 2 compiled again (dynamic), call 3 nothing
    assert seen[1] < seen[2] == after  # the recompile happened in warm-up 2, outside any capture
    graph, out = capture_graph(lambda: fn(other), torch.cuda.graph_pool_handle())
    assert compile_events() == after
    other.copy_(torch.randn_like(other))
    graph.replay()
    torch.testing.assert_close(out, (other * 2).sin().sum(-1))
