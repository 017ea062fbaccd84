#!/usr/bin/env python3
"""Where a whole run's start-up and end go: `brisk train` on the whole-run workload under cProfile.

Runs the fast-path training of bench/whole_run.py for a few steps (export on) in this process under
cProfile and writes the main thread's top functions by cumulative and by own time. Run it after
whole_run.py on the same --work folder, so the model folder exists and the Inductor cache is warm.

    python bench/profile_startup.py --work /tmp/wr_work --out bench/results/<date>/startup_profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def main() -> int:
    from whole_run import FAST

    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/wr_work")
    ap.add_argument("--data", default=str(REPO / "bench" / "tmp" / "wholerun_data"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args()
    work, data = Path(a.work), Path(a.data)
    run_dir = work / "run_profile"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["train", str(REPO / "configs" / "fun_asr_nano.yaml"), f"model.path={work / 'nano_folder'}",
            f"data.train={data / 'train.jsonl'}", f"data.valid={data / 'valid.jsonl'}", f"train.output_dir={run_dir}",
            f"train.max_steps={a.steps}", "train.progress=false", "train.tensorboard=false",
            f"speed.inductor_cache_dir={work / 'inductor_cache'}", "train.device=cuda", *FAST]
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    from brisk.cli import main as brisk_main

    rc = brisk_main(args)
    prof.disable()
    wall = time.perf_counter() - t0
    out = io.StringIO()
    out.write(f"# brisk {' '.join(args)}\n# rc {rc}, {wall:.1f} s under cProfile (main thread only)\n\n")
    for key in ("cumulative", "tottime"):
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats(key).print_stats(a.top)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    text = out.getvalue().replace(str(REPO) + "/", "")
    Path(a.out).write_text(text)
    print(text[:6000])
    shutil.rmtree(run_dir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
