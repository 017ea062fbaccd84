"""Where a run's wall time went, from the process's start to the export: named spans in timeline.json.

The clock starts when the process started (Linux: /proc/self/stat), so Python's own start and the imports count,
as they do for a user waiting at the prompt. Each ``end(name)`` closes the span since the previous one; the
trainer adds when its first step started and ended. The process's exit after the last span is not seen from
inside it (bench/whole_run.py times it from outside). This module imports no torch: the report reads its file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

_IMPORTED = time.perf_counter()
_FIRST = True  # the first timeline of a process starts at the process's start, a later one when it is made


def process_age() -> float | None:
    """Seconds since this process started, or None where /proc is not there."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5): clock ticks after boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Timeline:
    def __init__(self):
        global _FIRST
        age = process_age() if _FIRST else None
        self.origin = "process start" if age is not None else "brisk train called"
        self.t0 = time.perf_counter() - (age if age is not None else 0.0)
        _FIRST = False
        self.spans: list[tuple[str, float]] = []
        self.last = self.t0
        self.marks: dict[str, float] = {}
        self.details: dict[str, dict[str, float]] = {}  # a span's parts, measured inside it (the training's)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def end(self, name: str) -> None:
        """Close the span since the previous ``end`` (or the start) under ``name``."""
        t = time.perf_counter()
        self.spans.append((name, t - self.last))
        self.last = t

    def mark(self, name: str) -> None:
        """A moment, in seconds from the start (the first step's start and end); called every step, kept once."""
        if name not in self.marks:
            self.marks[name] = self.now()

    def to_dict(self) -> dict:
        return {"from": self.origin, "spans": [{"name": n, "seconds": round(s, 3)} for n, s in self.spans],
                "marks": {k: round(v, 3) for k, v in self.marks.items()},
                "details": {k: {p: round(v, 3) for p, v in d.items()} for k, d in self.details.items()},
                "total": round(self.now(), 3)}

    def summary(self) -> str:
        """One log line: every span, and when the first step started."""
        first = self.marks.get("first step start")
        return (", ".join(f"{n} {s:.1f} s" for n, s in self.spans)
                + (f"; the first step started {first:.1f} s after the {self.origin}" if first is not None else ""))

    def write(self, run_dir: Path) -> None:
        tmp = run_dir / "timeline.json.tmp"
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(run_dir / "timeline.json")


def read(run_dir: Path) -> dict | None:
    path = run_dir / "timeline.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
