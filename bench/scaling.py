"""Scaling table: 1 GPU against N GPUs (torchrun), torch defaults against the fast path, on the same data.

    python bench/scaling.py                      # GPU counts 1 and all visible; outputs in $OUT or bench/tmp/scaling
    python bench/scaling.py --gpus 1,2,4 --steps 60 --out DIR [key=value ...]
    python bench/scaling.py --gpus 1 --out DIR; python bench/scaling.py --gpus 2 --out DIR --append   # two jobs

Each (arm, GPU count) is one `brisk train` run of bench/configs/bench_nano.yaml (Fun-ASR-Nano at real sizes,
random weights, the AISHELL-1-like length profile) for warm-up + timed steps, without checkpoints or
validation. Timings come from the trainer's own step records (steps.jsonl, steps.rank<r>.jsonl): a job
step is the slowest rank's step (the ranks meet at the gradient all-reduce); tokens/s is the real LLM tokens
of all ranks over the job steps' time; scaling efficiency = tokens/s on N GPUs / (N x tokens/s on 1 GPU).
Every rank trains on its own batches (data parallel: the global batch grows with N, as in FunASR's recipe).
The environment keeps NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1) and sets TORCHINDUCTOR_CACHE_DIR. The markdown table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARMS = {
    "torch defaults": [],
    "sdpa_backends + frozen_eval": ["speed.sdpa_backends=[flash,efficient,math]", "speed.frozen_eval=true"],
    "fast path": ["speed.packing=true", "speed.cuda_graph=true", "speed.frozen_eval=true", "speed.encoder_dtype=bf16",
                  "speed.sdpa_backends=[flash,efficient,math]"],
    # FSDP2 runs the eager step (with --config configs/fun_asr_1p7b.yaml for a decoder where sharding pays).
    "fsdp": ["train.parallel=fsdp", "speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true",
             "speed.encoder_dtype=bf16"],
}
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
       "PYTHONUNBUFFERED": "1"}


def run(arm: str, gpus: int, args, out: Path) -> dict:
    folder = out / f"{arm.replace(' ', '_').replace('+', 'plus')}_{gpus}gpu"
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
                if gpus > 1 else [sys.executable])
    cmd = [*launcher, "-m", "brisk", "train", args.config, *ARMS[arm], *args.overrides,
           f"train.output_dir={folder}", f"train.max_steps={args.warmup + args.steps}", "train.save_final=false",
           "train.export=none", "train.val_every=0", "train.save_every=0", "data.valid=null",
           "diagnose.report=false", "train.progress=false", "train.tensorboard=false", "train.log_every=20",
           f"data.num_workers={args.workers}", "train.device=cuda"]
    env = {**os.environ, **ENV, "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(out / "inductor"))}
    t0 = time.perf_counter()
    with open(out / f"{folder.name}.log", "w") as log:
        try:
            res = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, timeout=args.timeout)
            rc = res.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    print(f"{arm}, {gpus} GPU(s): exit {rc}, {wall:.0f} s (log: {out / (folder.name + '.log')})", flush=True)
    try:  # the per-rank report (job step = slowest rank, each rank's slow steps) beside the run
        sys.path.insert(0, str(REPO))
        from brisk.diagnose.report import write_report

        write_report(folder)
    except Exception as e:  # noqa: BLE001 - a missing plot must not lose the table
        print(f"  no report for {folder.name}: {e}")
    return {"arm": arm, "gpus": gpus, "rc": rc, "wall": wall, **measure(folder, gpus, args.warmup)}


def measure(folder: Path, gpus: int, warmup: int) -> dict:
    ranks = []
    for r in range(gpus):
        path = folder / ("steps.jsonl" if r == 0 else f"steps.rank{r}.jsonl")
        if not path.exists():
            return {"error": f"no {path.name}"}
        recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        ranks.append({x["step"]: x for x in recs if x["step"] > warmup})
    common = sorted(set.intersection(*(set(r) for r in ranks)))
    if not common:
        return {"error": "no timed steps"}
    job = [max(r[s]["total"] for r in ranks) for s in common]
    tokens = sum(r[s]["shape"]["tokens"] for r in ranks for s in common)
    back = [statistics.median(r[s]["backward"] for s in common) for r in ranks]
    return {"steps": len(common), "mean": statistics.fmean(job), "median": statistics.median(job),
            "tokens_per_s": tokens / sum(job), "tokens_per_step": tokens / len(common),
            "backward_median": statistics.fmean(back)}


def table(results: list[dict]) -> str:
    lines = ["| arm | GPUs | timed steps | step mean | step median | backward median | LLM tokens/step (all ranks) | "
             "tokens/s | scaling efficiency |", "|---|---|---|---|---|---|---|---|---|"]
    base = {r["arm"]: r for r in results if r["gpus"] == 1 and "tokens_per_s" in r}
    for r in results:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['arm']} | {r['gpus']} | failed: {r.get('error', '')} (exit {r['rc']}) | | | | | | |")
            continue
        b = base.get(r["arm"])
        eff = f"{r['tokens_per_s'] / (r['gpus'] * b['tokens_per_s']):.1%}" if b else "n/a"
        lines.append(f"| {r['arm']} | {r['gpus']} | {r['steps']} | {r['mean'] * 1000:.1f} ms | {r['median'] * 1000:.1f} ms | "
                     f"{r['backward_median'] * 1000:.1f} ms | {r['tokens_per_step']:.0f} | {r['tokens_per_s']:.0f} | {eff} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default=None, help="GPU counts, e.g. 1,2,4 (default: 1 and all visible)")
    ap.add_argument("--arms", default="torch defaults,fast path", help=f"comma-separated, from: {', '.join(ARMS)}")
    ap.add_argument("--steps", type=int, default=60, help="timed steps a run")
    ap.add_argument("--warmup", type=int, default=10, help="steps a run before timing")
    ap.add_argument("--workers", type=int, default=2, help="data.num_workers per rank")
    ap.add_argument("--timeout", type=int, default=130, help="seconds a run at most (4 runs fit a 10-minute job)")
    ap.add_argument("--config", default=str(REPO / "bench/configs/bench_nano.yaml"))
    ap.add_argument("--out", default=os.environ.get("OUT", str(REPO / "bench/tmp/scaling")))
    ap.add_argument("--append", action="store_true", help="add to the results already in --out/scaling.json (same "
                    "config): take the 1-GPU runs in one job and the N-GPU runs in a later one")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = ap.parse_args()
    n = torch.cuda.device_count()
    counts = [int(x) for x in args.gpus.split(",")] if args.gpus else sorted({1, n})
    if max(counts) > n:
        raise SystemExit(f"error: --gpus {args.gpus}: only {n} GPU(s) visible")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    setup = {"config": args.config, "steps": args.steps, "warmup": args.warmup, "workers": args.workers,
             "overrides": args.overrides}
    results = []
    if args.append and (out / "scaling.json").exists():
        old = json.loads((out / "scaling.json").read_text())
        if old.get("setup") != setup:
            raise SystemExit(f"error: --append: {out / 'scaling.json'} was measured with {old.get('setup')}, not {setup}")
        results = old["results"]
    for arm in [a.strip() for a in args.arms.split(",")]:
        if arm not in ARMS:
            raise SystemExit(f"error: --arms: unknown arm {arm!r}; choose from {', '.join(ARMS)}")
        for g in counts:
            results = [r for r in results if (r["arm"], r["gpus"]) != (arm, g)] + [run(arm, g, args, out)]
            (out / "scaling.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                          "setup": setup, "results": results}, indent=1))
    text = (f"Scaling on {n} x {torch.cuda.get_device_name()} (torch {torch.__version__}), {os.path.basename(args.config)}, "
            f"{args.steps} timed steps after {args.warmup}; efficiency = tokens/s / (GPUs x 1-GPU tokens/s)\n\n" + table(results))
    (out / "scaling.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
