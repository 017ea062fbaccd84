"""How reading a batch's audio files scales with reader threads on this machine: the recognizer's own reader
(brisk.data.audio.read_audio, as brisk.eval.decode reads a batch) over the same files with 1, 2, 4, 8 and 15
threads, the median of 5 reads each after one warm read, and the single-file time for reference.

    python bench/read_scaling.py bench/tmp/wholerun_data/audio/valid --files 40

Round 7 read 40 ogg files in 36-65 ms on the H200 host's 15 threads where one file took 2.8 ms (ideal ~8 ms);
on a 2-core machine 2 threads read 1.70x faster than one (libsndfile's decode runs without the GIL), so the
question this answers is what the 16-core host's threads actually give.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from brisk.data.audio import read_audio

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--fs", type=int, default=16000)
    ap.add_argument("--threads", default="1,2,4,8,15")
    a = ap.parse_args()
    files = sorted(str(p) for p in Path(a.folder).iterdir() if p.is_file())[:a.files]

    def read(p):
        return read_audio(p, a.fs)

    one = []
    for p in files[:5]:
        t0 = time.perf_counter()
        read(p)
        one.append(time.perf_counter() - t0)
    rows = []
    for n in (int(x) for x in a.threads.split(",")):
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(read, files))  # warm: threads started, files in the page cache
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                list(pool.map(read, files))
                times.append(time.perf_counter() - t0)
        rows.append((n, 1000 * statistics.median(times)))
    serial = rows[0][1] if rows and rows[0][0] == 1 else None
    print(f"{len(files)} files from {a.folder}; one file {1000 * statistics.median(one):.2f} ms (median of 5)\n")
    print("| threads | ms for the files (median of 5) | vs 1 thread |\n|---|---|---|")
    for n, ms in rows:
        print(f"| {n} | {ms:.1f} | {serial / ms:.2f}x |" if serial else f"| {n} | {ms:.1f} | - |")


if __name__ == "__main__":
    main()
