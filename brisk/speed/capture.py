"""Capturing a CUDA graph of code that torch.compile may still be compiling: warm it until it is settled, then capture
with compiles forbidden.

A graph records kernel launches; it cannot hold a compile, an autotuning benchmark, or the first load of a kernel's
binary (each reads or synchronises with the device). torch's ``make_graphed_callables`` warms a callable three
times on a side stream before it captures. Here a warm-up is repeated until one compiles nothing (Dynamo frames,
AOTAutograd graphs, Inductor's cache loads and lazily built backwards all count: ``compile_events``), so every
graph and kernel the capture will launch has been loaded and run once. A first call can change what the second one
compiles: a global it writes that the first graph guarded on, a graph built for the first call's state and
loaded from the cache only at the second. Then the capture runs under ``fail_on_recompile``: a compile that is
still needed raises a clear error before any kernel is recorded, instead of a CUDA error at the end of the capture.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable

import torch

log = logging.getLogger("brisk")

MAX_WARMUPS = 3  # as torch.cuda.make_graphed_callables' default


def compile_events() -> int:
    """How many compile phases torch.compile has timed in this process so far (any new one: something compiled or
    was loaded from the compile caches)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics, counters
    except Exception:  # pragma: no cover
        return 0
    return (sum(len(v) for v in compilation_time_metrics.values())
            + int(counters["stats"].get("unique_graphs", 0)) + int(sum(counters["recompiles"].values())))


def on_side_stream(fn: Callable, stream: torch.cuda.Stream | None = None, device=None):
    """``fn()`` on a side stream (``stream``, else a new one) that waits for ``device``'s current one, and the current
    one for it (a warm-up's work is then ordered with what comes before and after, and its allocations are not the
    capture stream's)."""
    side = stream or torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        out = fn()
    torch.cuda.current_stream(device).wait_stream(side)
    return out


def settle(warm: Callable[[], object], done: int = 0, what: str = "graph") -> int:
    """Call ``warm()`` until a call compiles nothing new, ``MAX_WARMUPS`` calls at most; ``done``: calls the caller
    made already (the last of which compiled, or it would not ask). Returns the calls made here."""
    calls = 0
    while done + calls < MAX_WARMUPS:
        before = compile_events()
        warm()
        calls += 1
        if compile_events() == before:
            return calls
    log.info("cuda_graph: %s still compiled something in its warm-up %d of %d; capturing anyway (a compile left "
             "is refused during the capture)", what, done + calls, MAX_WARMUPS)
    return calls


@contextmanager
def no_compiles():
    """Dynamo may run only graphs it has: a recompile raises (torch.compiler.set_stance("fail_on_recompile"))."""
    with torch.compiler.set_stance("fail_on_recompile"):
        yield


def capture_graph(fn: Callable[[], object], pool, stream: torch.cuda.Stream | None = None):
    """``fn()`` captured into a new CUDA graph from ``pool``, compiles forbidden: (graph, fn's output)."""
    graph = torch.cuda.CUDAGraph()
    with no_compiles(), torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        out = fn()
    return graph, out
