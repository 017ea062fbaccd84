"""Slow-step detector: a step over k x the running median is explained as soon as its timing is known.

The cause comes from evidence recorded with the step, checked in this order: work charged to the step
from outside it (a checkpoint, a validation pass), a torch.compile (re)compile (Dynamo's own counters),
garbage collection (timed by gc.callbacks), a data-loader wait, a busy machine (see below), a batch
shape seen for the first time (with the cuDNN plan-build explanation where it applies), else "unknown".

A busy machine: other processes hold the cores when the run queue (the 1-minute load average) is at
least the number of cores this process may use and a step got less than CPU_SHARE_DROP of the CPU
seconds per second of wall time it should get: the running median of that share, and on the CPU device
at least one core's worth (the training thread itself), so a run that is starved from its first step is
caught too. In a virtual machine the cores can also be taken from outside it: the hypervisor runs other
machines on them, the load average inside does not rise, and Linux counts that time as steal (/proc/stat).
A step that got too little CPU while steal was at least STEAL_SHARE of the VM's CPU time is named too, with
the steal. It is named once, with the load or the steal, whether or not steps are over the slow bar; slow
steps of that cause are then counted. Every slow step goes to slow_steps.jsonl; the log prints the first few of
each cause, then one summary line every SUMMARY_EVERY slow steps, and the counts by cause at the end.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from collections import Counter
from pathlib import Path

from .timer import RunningMedian

log = logging.getLogger("brisk")

CPU_SHARE_DROP = 0.6  # a step with less than this fraction of its expected CPU share, on a full run queue: contention
STEAL_SHARE = 0.2  # ... or with at least this share of the VM's CPU time taken by its hypervisor (steal)
SHOW_PER_CAUSE = 3  # slow steps of one cause printed one by one; after that they are counted
SUMMARY_EVERY = 50  # slow steps between two summary lines


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; a container's cpuset), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def contention(cpu: float | None, host: float, expected: float, load: float, cores: int,
               steal: float | None = None) -> str | None:
    """Why the step ran short of CPU, or None: its CPU seconds per wall second fell below CPU_SHARE_DROP of
    ``expected`` while the run queue (load average) filled the cores, or while the hypervisor took at least
    STEAL_SHARE of the machine's CPU time (``steal``: that share over the step)."""
    if cpu is None or host <= 0 or expected <= 0:
        return None
    share = cpu / host
    if share >= CPU_SHARE_DROP * expected:
        return None
    got = f"this process got {share:.2f} CPU-seconds per second of the step where {expected:.2f} are expected"
    if load >= cores:
        return (f"the machine is busy: load average {load:.1f} on {cores} cores, and {got}; other processes are "
                "taking the cores (see `top`)")
    if steal is not None and steal >= STEAL_SHARE:
        return (f"the virtual machine's host is busy: {steal:.0%} of this machine's CPU time went to other machines "
                f"(steal, /proc/stat) during the step, and {got}; nothing inside this machine frees those cores")
    return None


class GCWatch:
    """Total seconds spent in Python's garbage collector, and the collections, from gc.callbacks; stops at
    ``close`` (or at the end of a ``with`` block)."""

    def __init__(self):
        self.seconds = 0.0
        self.collections = 0
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0:
            self.seconds += time.perf_counter() - self._t0
            self.collections += 1
            self._t0 = 0.0

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def __enter__(self) -> "GCWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def explain(rec: dict, median: float, data_median: float, trap: str | None, busy: str | None = None) -> tuple[str, str]:
    """(cause, explanation) for a slow step record; ``busy``: the contention explanation, if any."""
    excess = rec["total"] - median
    for name in ("checkpoint", "validation"):
        t = rec["events"].get(name, 0.0)
        if t > 0.5 * excess:
            return name, f"{name} took {t:.2f} s inside this step"
    if rec.get("step_captures", 0) > 0 or rec.get("audio_captures", 0) > 0:  # (negative after a release)
        s = rec["shape"]
        what = ([f"a step graph for a batch key no graph had yet ({s.get('rows')}x{s.get('len')} tokens)"]
                if rec.get("step_captures", 0) > 0 else [])
        what += ([f"an audio graph for a new speech shape (speech {s.get('speech_shape')})"]
                 if rec.get("audio_captures", 0) > 0 else [])
        compiled = f", compiling {rec['compiles']} graph(s)" if rec.get("compiles", 0) > 0 else ""
        return "graph_capture", (f"speed.cuda_graph captured {' and '.join(what)}{compiled}; under "
                                 "speed.graph_capture=seen each bucket's graphs come at its first batch (ahead: "
                                 "before the first step)")
    if rec.get("compiles", 0) > 0:
        return "recompile", (f"torch.compile compiled {rec['compiles']} new graph(s) during this step "
                             f"(shape {rec['shape'].get('rows')}x{rec['shape'].get('len')}); see speed.compile docs")
    gct = rec.get("gc", 0.0) + rec["events"].get("gc", 0.0)
    if gct > 0.5 * excess:
        return "gc", f"Python garbage collection took {gct:.2f} s (train.gc_every moves collections to known steps)"
    if rec["data"] > 0.5 * excess and rec["data"] > 2 * max(data_median, 1e-4):
        return "data", (f"waited {rec['data']:.2f} s for the data loader (median {data_median:.3f} s): "
                        "raise data.num_workers or check the audio storage")
    if busy:  # before a new shape: a shape's set-up is CPU work too, and a busy machine stretches it
        return "contention", busy
    if rec.get("new_shape"):
        s = rec["shape"]
        text = f"first step with this batch shape ({s.get('layout')} {s.get('rows')}x{s.get('len')} tokens, speech {s.get('speech_shape')})"
        if trap and s.get("layout") == "padded":
            return "plan_build", f"{text}: cuDNN SDPA plan build. {trap}"
        return "new_shape", f"{text}: kernels, allocator blocks and plans are set up for new shapes"
    return "unknown", "no recorded cause (try `brisk profile` on this configuration)"


class SlowStepDetector:
    def __init__(self, factor: float = 3.0, warmup: int = 3, window: int = 50, trap: str | None = None,
                 path: Path | None = None, cores: int | None = None, load=os.getloadavg, cpu_device: bool = False):
        self.factor, self.warmup, self.trap = factor, warmup, trap
        self.median = RunningMedian(window)
        self.data_median = RunningMedian(window)
        self.cpu_share = RunningMedian(window)  # CPU seconds per wall second of steps that were not slow
        self.cores, self.load = cores or usable_cores(), load
        self.floor = 1.0 if cpu_device else 0.0  # CPU training: the training thread alone should get a core
        self.busy: str | None = None  # the contention explanation, once named
        self.seen = 0
        self.slow: list[dict] = []
        self.causes: Counter = Counter()
        self.unprinted: Counter = Counter()  # slow steps counted since the last line that named them
        self.path = path
        self.file = path.open("a", encoding="utf-8") if path else None

    def observe(self, rec: dict) -> dict | None:
        self.seen += 1
        med, dmed = self.median.value, self.data_median.value
        found, busy = None, None
        if self.seen > self.warmup:
            expected = max(self.cpu_share.value, self.floor)
            busy = contention(rec.get("cpu"), rec.get("host", 0.0), expected, self.load()[0], self.cores,
                              rec.get("steal"))
            if busy and self.busy is None:
                self.busy = busy
                log.warning("step %d: %s; slow steps of this cause are counted, not printed", rec["step"], busy)
        if self.seen > self.warmup and med > 0 and rec["total"] > self.factor * med:
            cause, why = explain(rec, med, dmed, self.trap, busy)
            found = {"step": rec["step"], "total": rec["total"], "median": med, "ratio": rec["total"] / med,
                     "cause": cause, "why": why}
            self.slow.append(found)
            self._say(found)
            if self.file:
                self.file.write(json.dumps(found) + "\n")
                self.file.flush()
        # Slow steps do not enter the median, so a burst of them cannot raise the bar for the next ones.
        if found is None:
            self.median.add(rec["total"])
            if rec.get("cpu") is not None and rec.get("host", 0) > 0:
                self.cpu_share.add(rec["cpu"] / rec["host"])
        self.data_median.add(rec["data"])
        return found

    def _say(self, found: dict) -> None:
        """The first slow steps of each cause one by one (contention is named once, when first seen); then a
        summary line every SUMMARY_EVERY slow steps."""
        cause = found["cause"]
        self.causes[cause] += 1
        if cause != "contention" and self.causes[cause] <= SHOW_PER_CAUSE:  # contention: named once, above
            more = " (later slow steps of this cause are counted, not printed)" if self.causes[cause] == SHOW_PER_CAUSE else ""
            log.warning("slow step %d: %.3f s (%.1fx the median %.3f s): %s%s", found["step"], found["total"],
                        found["ratio"], found["median"], found["why"], more)
            return
        self.unprinted[cause] += 1
        if sum(self.unprinted.values()) >= SUMMARY_EVERY:
            log.warning("slow steps: %d more up to step %d (%s); each is in slow_steps.jsonl",
                        sum(self.unprinted.values()), found["step"], by_cause(self.unprinted))
            self.unprinted.clear()

    def run_total(self) -> int:
        """Slow steps of the whole run: slow_steps.jsonl (a resumed run's earlier steps too, trimmed to its
        checkpoint), or this process's alone without a file."""
        if self.path is None or not self.path.exists():
            return len(self.slow)
        return sum(1 for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip())

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if sum(self.causes.values()) > SHOW_PER_CAUSE:
            log.info("slow steps in this process: %d (%s)", sum(self.causes.values()), by_cause(self.causes))


def by_cause(counts: Counter) -> str:
    return ", ".join(f"{c} {n}" for c, n in counts.most_common())
