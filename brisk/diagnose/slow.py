"""Slow-step detector: a step over k x the running median is explained as soon as its timing is known.

The cause comes from evidence recorded with the step, checked in this order: work charged to the step
from outside it (a checkpoint, a validation pass), a torch.compile (re)compile (Dynamo's own counters),
garbage collection (timed by gc.callbacks), a data-loader wait, a batch shape seen for the first time
(with the cuDNN plan-build explanation where it applies), else "unknown".
"""

from __future__ import annotations

import gc
import json
import logging
import time
from pathlib import Path

from .timer import RunningMedian

log = logging.getLogger("brisk")


class GCWatch:
    """Total seconds spent in Python's garbage collector, from gc.callbacks."""

    def __init__(self):
        self.seconds = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = 0.0

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


def explain(rec: dict, median: float, data_median: float, trap: str | None) -> tuple[str, str]:
    """(cause, explanation) for a slow step record."""
    excess = rec["total"] - median
    for name in ("checkpoint", "validation"):
        t = rec["events"].get(name, 0.0)
        if t > 0.5 * excess:
            return name, f"{name} took {t:.2f} s inside this step"
    if rec.get("compiles", 0) > 0:
        return "recompile", (f"torch.compile compiled {rec['compiles']} new graph(s) during this step "
                             f"(shape {rec['shape'].get('rows')}x{rec['shape'].get('len')}); see speed.compile docs")
    gct = rec.get("gc", 0.0) + rec["events"].get("gc", 0.0)
    if gct > 0.5 * excess:
        return "gc", f"Python garbage collection took {gct:.2f} s (train.gc_every moves collections to known steps)"
    if rec["data"] > 0.5 * excess and rec["data"] > 2 * max(data_median, 1e-4):
        return "data", (f"waited {rec['data']:.2f} s for the data loader (median {data_median:.3f} s): "
                        "raise data.num_workers or check the audio storage")
    if rec.get("new_shape"):
        s = rec["shape"]
        text = f"first step with this batch shape ({s.get('layout')} {s.get('rows')}x{s.get('len')} tokens, speech {s.get('speech_shape')})"
        if trap and s.get("layout") == "padded":
            return "plan_build", f"{text}: cuDNN SDPA plan build. {trap}"
        return "new_shape", f"{text}: kernels, allocator blocks and plans are set up for new shapes"
    return "unknown", "no recorded cause (try `brisk profile` on this configuration)"


class SlowStepDetector:
    def __init__(self, factor: float = 3.0, warmup: int = 3, window: int = 50, trap: str | None = None,
                 path: Path | None = None):
        self.factor, self.warmup, self.trap = factor, warmup, trap
        self.median = RunningMedian(window)
        self.data_median = RunningMedian(window)
        self.seen = 0
        self.slow: list[dict] = []
        self.file = path.open("a", encoding="utf-8") if path else None

    def observe(self, rec: dict) -> dict | None:
        self.seen += 1
        med, dmed = self.median.value, self.data_median.value
        found = None
        if self.seen > self.warmup and med > 0 and rec["total"] > self.factor * med:
            cause, why = explain(rec, med, dmed, self.trap)
            found = {"step": rec["step"], "total": rec["total"], "median": med, "ratio": rec["total"] / med,
                     "cause": cause, "why": why}
            self.slow.append(found)
            log.warning("slow step %d: %.3f s (%.1fx the median %.3f s): %s", rec["step"], rec["total"],
                        found["ratio"], med, why)
            if self.file:
                self.file.write(json.dumps(found) + "\n")
                self.file.flush()
        # Slow steps do not enter the median, so a burst of them cannot raise the bar for the next ones.
        if found is None:
            self.median.add(rec["total"])
        self.data_median.add(rec["data"])
        return found

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
