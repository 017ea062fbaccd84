#!/usr/bin/env python3
"""What the machine's disk and torch.save do with checkpoint-sized writes, and what start-up imports cost.

The whole run's checkpoints are bound by writes (bench/results/*/whole_run*): this says how much of a
write is torch.save itself (CRC32 on or off), how much the page cache takes, how much fsync waits for the
disk, and whether parallel writers get more from it. One table, printed last.

    python bench/io_probe.py --dir /tmp/io_probe --gb 3.6 --out bench/results/<date>/io_probe.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def write_raw(path: Path, nbytes: int, fsync: bool) -> tuple[float, float]:
    """(write seconds, fsync seconds) for nbytes from one reused 64 MB buffer."""
    buf = os.urandom(1 << 26)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, len(buf))
            f.write(buf[:n] if n < len(buf) else buf)
            left -= n
        f.flush()
        t1 = time.perf_counter()
        if fsync:
            os.fsync(f.fileno())
    return t1 - t0, time.perf_counter() - t1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/io_probe")
    ap.add_argument("--gb", type=float, default=3.6)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    nbytes = int(a.gb * 1e9)
    rows: list[tuple[str, float, str]] = []
    df = subprocess.run(["df", "-hT", str(d)], capture_output=True, text=True).stdout.strip()
    vm = {k: Path(f"/proc/sys/vm/{k}").read_text().strip() for k in ("dirty_ratio", "dirty_background_ratio",
          "dirty_expire_centisecs") if Path(f"/proc/sys/vm/{k}").exists()}

    def gbps(sec: float, n: int = nbytes) -> str:
        return f"{n / 1e9 / sec:.2f} GB/s" if sec > 0 else "-"

    # raw bytes: page cache only, then with fsync
    w, s = write_raw(d / "raw0", nbytes, fsync=True)
    rows += [("raw write into the page cache", w, gbps(w)), ("  its fsync", s, gbps(w + s) + " overall")]
    os.remove(d / "raw0")
    # four writers at once, a quarter each, each fsynced
    res = {}

    def part(i):
        res[i] = write_raw(d / f"raw{i}", nbytes // 4, fsync=True)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=part, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    t = time.perf_counter() - t0
    rows.append(("4 parallel writers, each fsynced", t, gbps(t)))
    for i in range(4):
        os.remove(d / f"raw{i}")

    import torch
    from torch.utils.serialization import config as ser

    n = nbytes // 2  # bf16 elements
    state = {f"t{i}": torch.empty(n // 16, dtype=torch.bfloat16).normal_() for i in range(16)}
    for crc in (True, False):
        with ser.patch({"save.compute_crc32": crc}):
            path = d / f"ckpt_crc{int(crc)}.pt"
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                t1 = time.perf_counter()
                os.fsync(f.fileno())
            t2 = time.perf_counter()
        rows += [(f"torch.save, compute_crc32={crc}", t1 - t0, gbps(t1 - t0)), ("  its fsync", t2 - t1, gbps(t2 - t0) + " overall")]
    t = timed(lambda: torch.load(d / "ckpt_crc0.pt", mmap=True, weights_only=True))
    rows.append(("torch.load(mmap=True) of the CRC-less file", t, ""))
    t = timed(lambda: torch.load(d / "ckpt_crc0.pt", weights_only=True))
    rows.append(("torch.load of the CRC-less file (page cache)", t, gbps(t)))
    for p in d.glob("ckpt_*.pt"):
        os.remove(p)

    for mod in ("transformers", "transformers.models.qwen3.modeling_qwen3", "matplotlib.pyplot", "brisk.cli"):
        r = subprocess.run([sys.executable, "-c", f"import time; t=time.perf_counter(); import {mod}; print(time.perf_counter()-t)"],
                           capture_output=True, text=True)
        rows.append((f"import {mod} (fresh process, torch included)", float(r.stdout.strip() or "nan"), r.stderr.strip()[-80:]))

    lines = [f"# I/O probe: {nbytes / 1e9:.2f} GB to {d}", "", "```", df, f"vm: {vm}", "```", "",
             "| what | seconds | rate |", "|---|---|---|"] + [f"| {w} | {s:.2f} | {r} |" for w, s, r in rows]
    text = "\n".join(lines)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
