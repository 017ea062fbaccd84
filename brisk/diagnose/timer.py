"""Step timer: data wait, forward, backward, optimizer and total time of every step, with its batch shape.

On a GPU the phases are CUDA events recorded at the phase ends (no sync inside the step) and read back a
couple of steps later; on the CPU they are clock readings. The step's time on a GPU is the device's span
from the step's first to its last event: host stalls inside the step (a cuDNN plan build, a compile) show
up as idle device time inside that span, while the host running ahead of the device does not. Data wait,
and work between steps (validation, checkpoints, garbage collection), are host clock readings added to it.
One JSON line a step goes to steps.jsonl in the run folder.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path

import torch

PHASES = ("forward", "backward", "optimizer")


def steal_seconds() -> float | None:
    """CPU seconds that the hypervisor has given this (virtual) machine's CPUs to others since boot, summed over
    its CPUs (/proc/stat's steal column); None where the kernel does not say (not Linux, an old kernel)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def steal_share(start: float | None, end: float | None, seconds: float) -> float | None:
    """The share of all this machine's CPU time over ``seconds`` of wall time that went to other machines, from
    two ``steal_seconds`` readings; None where either is unknown."""
    if start is None or end is None or seconds <= 0:
        return None
    return round((end - start) / (seconds * (os.cpu_count() or 1)), 4)


class StepTimer:
    def __init__(self, device: torch.device, path: Path | None = None, lag: int = 2):
        self.cuda = device.type == "cuda"
        self.path = path
        self.file = path.open("a", encoding="utf-8") if path else None
        self.lag = lag
        self.pending: deque[dict] = deque()
        self.current: dict | None = None
        self.seen_shapes: set = set()
        self.between: dict[str, float] = {}  # work done between steps (epoch-end validation, checkpoint)

    # ------------------------------------------------------------------------------ inside the loop
    def _stamp(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self, step: int, epoch: int, batch, data_wait: float, counters: dict) -> None:
        key = batch.shape_key()
        self.current = {"step": step, "epoch": epoch, "data": data_wait, "shape": batch.shape,
                        "new_shape": key not in self.seen_shapes, "events": self.between, "marks": [("start", self._stamp())],
                        "host_start": time.perf_counter(), "cpu_start": time.process_time(), "counters0": counters,
                        "steal_start": steal_seconds()}
        self.seen_shapes.add(key)
        self.between = {}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def mark(self, name: str) -> None:
        if self.current is not None:
            self.current["marks"].append((name, self._stamp()))

    def event(self, name: str, seconds: float) -> None:
        """Work charged to the current step from outside it (validation, checkpoint, gc)."""
        # Outside a step (the end of an epoch) the work delays the next step, so it is charged there.
        events = self.current["events"] if self.current is not None else self.between
        events[name] = events.get(name, 0.0) + seconds

    def end(self, counters: dict) -> list[dict]:
        """Close the current step; returns the records that are now complete (older steps on a GPU)."""
        rec = self.current
        if rec is None:
            return []
        rec["host_end"] = time.perf_counter()
        rec["cpu_end"] = time.process_time()  # this process's CPU seconds (all threads): against host, contention
        rec["steal_end"] = steal_seconds()  # the hypervisor's share of the machine's CPUs (a VM), same purpose
        rec["counters1"] = counters
        if self.cuda:
            rec["mem_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        self.pending.append(rec)
        self.current = None
        return self._drain(force=False)

    def flush(self) -> list[dict]:
        return self._drain(force=True)

    # ------------------------------------------------------------------------------------ read back
    def _drain(self, force: bool) -> list[dict]:
        done = []
        while self.pending and (force or len(self.pending) > self.lag or self._ready(self.pending[0])):
            done.append(self._finish(self.pending.popleft()))
        return done

    def _ready(self, rec: dict) -> bool:
        return not self.cuda or rec["marks"][-1][1].query()

    def _finish(self, rec: dict) -> dict:
        marks = rec.pop("marks")
        if self.cuda:
            marks[-1][1].synchronize()  # an old event: normally long complete, so no real wait
            span = lambda a, b: a.elapsed_time(b) / 1000.0  # noqa: E731
        else:
            span = lambda a, b: b - a  # noqa: E731
        phases = {p: 0.0 for p in PHASES}
        for (_, a), (name, b) in zip(marks, marks[1:]):
            if name in phases:
                phases[name] += span(a, b)
        compute = span(marks[0][1], marks[-1][1])
        extra = sum(rec["events"].values())
        c0, c1 = rec.pop("counters0"), rec.pop("counters1")
        out = {
            "step": rec["step"], "epoch": rec["epoch"],
            "total": rec["data"] + compute + extra,
            "data": rec["data"], "compute": compute, **phases,
            "host": rec["host_end"] - rec["host_start"], "cpu": rec["cpu_end"] - rec["cpu_start"],
            "events": rec["events"], "shape": rec["shape"], "new_shape": rec["new_shape"],
            "compiles": c1.get("graphs", 0) - c0.get("graphs", 0),
            "step_captures": c1.get("step_captures", 0) - c0.get("step_captures", 0),
            "audio_captures": c1.get("audio_captures", 0) - c0.get("audio_captures", 0),
            "gc": c1.get("gc_seconds", 0.0) - c0.get("gc_seconds", 0.0),
            "compile_s": round(c1.get("compile_seconds", 0.0) - c0.get("compile_seconds", 0.0), 4),
        }
        if out["compile_s"]:  # which part of torch.compile the step waited on (speed.compile.compile_split)
            out["compile_split"] = {k: round(c1.get(f"compile_{k}_seconds", 0.0) - c0.get(f"compile_{k}_seconds", 0.0), 4)
                                    for k in ("trace", "backend", "backward")}
        steal = steal_share(rec["steal_start"], rec["steal_end"], out["host"])
        if steal is not None:
            out["steal"] = steal
        if "mem_peak_gb" in rec:
            out["mem_peak_gb"] = round(rec["mem_peak_gb"], 3)
        if self.file:
            self.file.write(json.dumps(out) + "\n")
            self.file.flush()
        return out

    def close(self) -> list[dict]:
        done = self.flush()
        if self.file:
            self.file.close()
            self.file = None
        return done


class RunningMedian:
    def __init__(self, window: int):
        self.values: deque[float] = deque(maxlen=window)

    def add(self, v: float) -> None:
        self.values.append(v)

    @property
    def value(self) -> float:
        s = sorted(self.values)
        n = len(s)
        if not n:
            return 0.0
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
