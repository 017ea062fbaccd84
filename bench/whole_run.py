#!/usr/bin/env python3
"""The whole run, launch to exported model: `python -m brisk train` as a subprocess, every phase timed.

One call does the whole comparison: a real-size random Fun-ASR-Nano folder in FunASR's layout is built
(tools/make_nano_folder.py, on the GPU) unless --model names one, then brisk trains on the espeak-ng set
(tools/make_wholerun_data.py: 360/40 utterances, made where espeak-ng or brisk[tools]'s libespeak-ng is
installed, not on the GPU machine) for 4 epochs with validation and a checkpoint after each (finetune.sh settings), with the fast
path, once with an empty Inductor cache (cold) and once with the cache the first run left (warm).

Phases come from the run's own files: train.log timestamps (launch -> "training from step" = start-up;
"time around the steps" = validation, checkpoint stalls and the final write's wait; "exported" =
export), steps.jsonl (step time, compile seconds), checkpoints.jsonl (each checkpoint's stall, write
time, size and the footprint), and the subprocess's wall clock (exit = process end - last log line).
After each run the bench waits for the disk (`sync`, timed and reported as "writes reaching the disk") so the
next run does not start on a disk still writing the last one's checkpoints. Writes whole_run.md, whole_run.json and whole_run_logs.tgz (logs only, no weights) to --out; the run
folders and the cache stay under --work. The table is printed last.

    python bench/whole_run.py --out bench/results/wholerun                       # GPU
    python bench/whole_run.py --tiny --out bench/tmp/wholerun_tiny_out          # CPU check, ~1-2 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from brisk.diagnose.report import step_kinds  # noqa: E402  (no torch: the report's module imports none)
from brisk.diagnose.timeline import read as read_timeline  # noqa: E402
import funasr_arm  # noqa: E402  (bench/funasr_arm.py, beside this file)
FAST = ["speed.packing=true", "speed.cuda_graph=true", "speed.frozen_eval=true", "speed.encoder_dtype=bf16",
        "speed.compile=true", "speed.fused_adamw=true", "speed.sdpa_backends=[flash,efficient,math]"]
# FunASR 1.4.16's own trainer on this workload, measured once on an H200 on 2026-11-29: a constant from an earlier
# machine, shown as such, not an arm of this call.
FUNASR = {"start-up to first step": 40.0, "steps": 65.0, "validation": 7.4, "checkpoint stalls": 83.0,
          "export": None, "whole run": 196.0}
LOG_FILES = ("train.log", "steps.jsonl", "checkpoints.jsonl", "accel.json", "slow_steps.jsonl", "config.yaml",
             "timeline.json", "history.jsonl")  # what is kept of each run (no weights)
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (.*)$")


def sh(cmd: list[str], log: Path, timeout: float, env: dict | None = None, cwd: Path = REPO) -> tuple[int, float, float]:
    """Run cmd in cwd, output to log; -> (return code, launch time, end time) as wall-clock seconds."""
    t0 = time.time()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env, cwd=cwd).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, t0, time.time()


def writeback() -> float:
    """Seconds until an arm's writes reach the disk. A run exits with its last writes still going to the disk (by
    design: durable in the background); waiting here, timed and reported, keeps the next arm off a disk busy with
    this arm's ~17 GB (a user's next run rarely starts the moment the last one ends)."""
    t0 = time.time()
    os.sync()
    return round(time.time() - t0, 2)


def log_lines(path: Path) -> list[tuple[float, str]]:
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else []:
        m = STAMP.match(line)
        if m:
            out.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2)))
    return out


def first(lines, pattern: str):
    rx = re.compile(pattern)
    for t, msg in lines:
        m = rx.search(msg)
        if m:
            return t, m
    return None, None


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def phases(run_dir: Path, launch: float, end: float, rc: int) -> dict:
    """Every phase of one run, in seconds, from its files and the subprocess's clock."""
    lines = log_lines(run_dir / "train.log")
    steps = jsonl(run_dir / "steps.jsonl")
    ckpts = jsonl(run_dir / "checkpoints.jsonl")
    r: dict = {"rc": rc, "wall": end - launch, "steps_n": len(steps)}
    _, m = first(lines, r"built in ([\d.]+) s")
    r["build_load"] = float(m.group(1)) if m else None
    _, m = first(lines, r"captured up front in ([\d.]+) s")
    r["capture"] = float(m.group(1)) if m else 0.0
    r["compile"] = sum(float(m.group(1)) for _, msg in lines if (m := re.search(r"speed\.compile: compiled .* in ([\d.]+) s", msg)))
    t_fit, _ = first(lines, r"^training from step")
    t_around, m = first(lines, r"^time around the steps: (\{.*\})")
    around = json.loads(m.group(1)) if m else {}
    t_export, _ = first(lines, r"^exported ")
    t_report, _ = first(lines, r"^report: ")
    r["startup"] = t_fit - launch if t_fit else None
    compute = [s["data"] + s["compute"] for s in steps]
    r["steps"] = sum(compute)
    r["step_mean_ms"] = 1000 * statistics.mean(compute) if compute else None
    r["step_median_ms"] = 1000 * statistics.median(compute) if compute else None
    r["validation"] = around.get("validation", 0.0)
    r["checkpoint_stalls"] = around.get("checkpoint", 0.0)
    r["checkpoint_max_stall"] = max((c["stall"] for c in ckpts), default=None)
    r["checkpoint_final_wait"] = around.get("checkpoint_exit_wait", 0.0)
    r["checkpoints"] = [{k: c.get(k) for k in ("step", "stall", "write", "bytes", "footprint", "frozen_write")} for c in ckpts]
    r["checkpoint_bytes"] = [c.get("bytes") for c in ckpts]
    r["footprint_bytes"] = ckpts[-1].get("footprint") if ckpts else None
    r["loop"] = t_around - t_fit if t_fit and t_around else None  # first step to the end of the last write
    r["export"] = t_export - t_around if t_export and t_around else None
    r["report"] = t_report - (t_export or t_around) if t_report and (t_export or t_around) else None
    r["exit"] = end - lines[-1][0] if lines else None  # the last log line to the process's end
    r["export_bytes"] = sum(p.stat().st_size for p in run_dir.glob("model-*/**/*") if p.is_file())
    history = jsonl(run_dir / "history.jsonl")
    r["val_loss_last"] = history[-1]["loss"] if history else None
    timeline = read_timeline(run_dir)  # the run's own spans (brisk.diagnose.timeline), where it wrote them
    if timeline:
        r["first_step_at"] = timeline["marks"].get("first step start")
        for kind, group in step_kinds(steps):
            r[f"steps: {kind}"] = sum(s["data"] + s["compute"] for s in group)
            r[f"steps: {kind}: n"] = len(group)
        r["compile_in_steps"] = sum(s.get("compile_s", 0.0) for s in steps)
    return r


def cell(r: dict, key: str, unit: str = "s") -> str:
    """A failed run's cells say FAILED with its exit code: its partial times are no result."""
    return f"FAILED (exit {r['rc']})" if r.get("rc") else fmt(r.get(key), unit)


def fmt(v, unit="s") -> str:
    if v is None:
        return "-"
    if unit == "loss":
        return f"{v:.4f}"
    return f"{v:.1f} {unit}" if unit == "s" else f"{v:.0f} {unit}"


def table(results: dict, tiny: bool) -> str:
    arms = list(results)
    name = "brisk, tiny CPU" if tiny else "brisk fast path"
    constant = not tiny and "funasr" not in results  # FunASR's trainer ran in this call: no constant column
    title = lambda a: "FunASR 1.4.16's trainer (finetune.sh), this call" if a == "funasr" else f"{name}, {a} cache"  # noqa: E731
    head = "| phase | " + " | ".join(title(a) for a in arms) + (
        " | FunASR 1.4.16, an H200 on 2026-11-29 (not this call) |" if constant else " |")
    rows = [head, "|---" * (len(arms) + 1 + (1 if constant else 0)) + "|"]

    def row(name, key, unit="s", funasr=None):
        cells = [cell(results[a], key, unit) for a in arms]
        rows.append(f"| {name} | " + " | ".join(cells) + (f" | {fmt(funasr) if funasr else '-'} |" if constant else " |"))

    row("start-up to first step", "startup", funasr=FUNASR["start-up to first step"])
    row("  first step started (from the process's start, timeline.json)", "first_step_at")
    row("  of which build/load", "build_load")
    row("  of which CUDA-graph capture (compiles inside)", "capture")
    row("compile (all speed.compile lines)", "compile")
    row("steps (data + compute)", "steps", funasr=FUNASR["steps"])
    row("  mean step", "step_mean_ms", "ms")
    row("  median step", "step_median_ms", "ms")
    kinds = sorted({k for a in arms for k in results[a] if k.startswith("steps: ") and not k.endswith(": n")})
    for k in kinds:
        row(f"  {k}", k)
    if kinds:
        row("  compiling inside the steps", "compile_in_steps")
    row("validation", "validation", funasr=FUNASR["validation"])
    row("checkpoint stalls (sum)", "checkpoint_stalls", funasr=FUNASR["checkpoint stalls"])
    row("  largest stall", "checkpoint_max_stall")
    row("  final write waited at the end", "checkpoint_final_wait")
    row("export", "export")
    row("report (plots)", "report")
    row("exit (last log line to process end)", "exit")
    row("whole run (launch to process end)", "wall", funasr=FUNASR["whole run"])
    row("validation loss after the last epoch", "val_loss_last", "loss")
    row("after it: its writes reaching the disk (sync)", "writeback_after_exit")
    for a in arms:
        r = results[a]
        if a == "funasr":
            rows.append(f"\nfunasr: {r.get('steps_n', 0)} steps, rc {r['rc']}; validation losses "
                        + ", ".join(f"epoch {v['epoch']}: {v['loss']:.4f}" for v in r.get("validation_losses", [])))
            continue
        sizes = ", ".join(f"{b / 1e9:.2f}" for b in r.get("checkpoint_bytes") or [])
        rows.append(f"\n{a}: {r['steps_n']} steps, rc {r['rc']}; checkpoints GB [{sizes}], footprint "
                    f"{(r.get('footprint_bytes') or 0) / 1e9:.2f} GB; export {r.get('export_bytes', 0) / 1e9:.2f} GB")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/wholerun_out")
    ap.add_argument("--work", default=None, help="run folders and the Inductor cache (default: <out>/../wholerun_work)")
    ap.add_argument("--data", default=None, help="folder with train.jsonl/valid.jsonl (default: bench/tmp/wholerun_data)")
    ap.add_argument("--model", default=None, help="a FunASR model folder (default: built by tools/make_nano_folder.py)")
    ap.add_argument("--tiny", action="store_true", help="tiny model, ~10 utterances, CPU, no speed switches")
    ap.add_argument("--arms", default="cold,warm", help="cold, warm (brisk with an empty and with the cold run's "
                    "compile cache), funasr (FunASR 1.4.16's trainer, bench/funasr_arm.py), in the order given")
    ap.add_argument("--funasr-wheels", default=str(REPO / ".whl" / "funasr"),
                    help="the folder of wheels the funasr arm installs (FunASR and what it imports beyond the GPU image)")
    ap.add_argument("--speed", choices=("fast", "preset"), default="fast",
                    help="fast: the round-2 fast path's switches, one by one; preset: speed.preset=fast")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per training run")
    ap.add_argument("--keep-runs", action="store_true", help="keep the run folders (checkpoints, exports)")
    ap.add_argument("--pycache", default="", help="bytecode cache for the runs (PYTHONPYCACHEPREFIX; default <work>/pycache; "
                    "'none': leave Python's setting as it is)")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work).resolve() if a.work else out.parent / f"{out.name}_work"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    meta: dict = {"started": datetime.now().isoformat(timespec="seconds"), "tiny": a.tiny}
    if a.pycache != "none":
        # An installed package has its .pyc files (pip compiles at install). Where site-packages has none and
        # cannot get them (read-only, or PYTHONDONTWRITEBYTECODE), every process compiles thousands of source
        # files: 8.4 s of each start-up on the GPU machine. Give the runs a bytecode cache, filled once here.
        meta["dont_write_bytecode"] = env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(a.pycache or work / "pycache").resolve())
        t0 = time.time()
        subprocess.run([sys.executable, "-c", "import brisk.cli, brisk.train.run, brisk.diagnose.report, matplotlib.pyplot, "
                        "transformers.models.qwen3.modeling_qwen3, torch._dynamo, torch._inductor.compile_fx"],
                       env=env, cwd=REPO, capture_output=True)
        meta["bytecode_cache"] = {"dir": env["PYTHONPYCACHEPREFIX"], "fill_s": round(time.time() - t0, 1)}

    data = Path(a.data or REPO / "bench" / "tmp" / ("wholerun_tiny" if a.tiny else "wholerun_data")).resolve()
    if not (data / "train.jsonl").exists():
        cmd = [sys.executable, str(REPO / "tools" / "make_wholerun_data.py"), "--out", str(data)]
        rc, t0, t1 = sh(cmd + (["--train", "8", "--valid", "2"] if a.tiny else []), work / "make_data.log", 900, env)
        if rc:
            print(f"whole_run: making the data set failed (needs espeak-ng or brisk[tools]): see {work / 'make_data.log'}")
            return 2
    model = Path(a.model).resolve() if a.model else work / ("nano_tiny" if a.tiny else "nano_folder")
    if not (model / "model.pt").exists():
        cmd = [sys.executable, str(REPO / "tools" / "make_nano_folder.py"), "--out", str(model)] + (["--tiny"] if a.tiny else [])
        rc, t0, t1 = sh(cmd, work / "make_model.log", 900, env)
        meta["model_folder_build_s"] = t1 - t0
        if rc:
            print(f"whole_run: building the model folder failed: see {work / 'make_model.log'}")
            return 2
    meta["data"] = json.loads((data / "stats.json").read_text()) if (data / "stats.json").exists() else str(data)

    t2 = time.time()
    os.sync()  # the model folder just built: on the disk before the first arm starts
    meta["sync_before_arms_s"] = round(time.time() - t2, 1)
    cache = work / "inductor_cache"
    results: dict = {}
    for arm in a.arms.split(","):
        if arm == "funasr":  # FunASR's own trainer, same data and model folder, same call
            site = funasr_arm.install(Path(a.funasr_wheels).resolve(), work / "funasr_site")
            fenv = {**env, "PYTHONPATH": os.pathsep.join([str(site), env.get("PYTHONPATH", "")])}
            fdir = work / "run_funasr"
            shutil.rmtree(fdir, ignore_errors=True)
            cmd = funasr_arm.command(model, data, fdir, a.epochs)
            print(f"whole_run: funasr: {' '.join(cmd[2:])}", flush=True)
            rc, t0, t1 = sh(cmd, work / "funasr.out", a.timeout, fenv, cwd=data)
            results[arm] = {"rc": rc, "wall": t1 - t0,
                            **funasr_arm.parse((work / "funasr.out").read_text(errors="replace"))}
            vals = results[arm]["validation_losses"]
            results[arm]["val_loss_last"] = vals[-1]["loss"] if vals else None
            results[arm]["writeback_after_exit"] = writeback()
            print(f"whole_run: funasr: rc {rc}, {t1 - t0:.1f} s", flush=True)
            if not a.keep_runs:
                shutil.rmtree(fdir, ignore_errors=True)
            if rc:
                print((work / "funasr.out").read_text(errors="replace")[-3000:])
            continue
        if arm == "cold" and cache.exists():
            shutil.rmtree(cache)
        run_dir = work / f"run_{arm}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "brisk", "train", str(REPO / "configs" / "fun_asr_nano.yaml"),
               f"model.path={model}", f"data.train={data / 'train.jsonl'}", f"data.valid={data / 'valid.jsonl'}",
               f"train.output_dir={run_dir}", f"train.max_epochs={a.epochs}", "train.max_steps=0", "train.val_every=0",
               "train.save_every=0", "train.progress=false", "train.tensorboard=false", "train.log_every=10",
               f"speed.inductor_cache_dir={cache}"]
        if a.tiny:
            cmd += ["train.device=cpu", "data.num_workers=0"]
        else:
            cmd += ["train.device=cuda", *(FAST if a.speed == "fast" else ["speed.preset=fast"])]
        cmd += a.overrides
        print(f"whole_run: {arm} cache: {' '.join(cmd[2:])}", flush=True)
        rc, t0, t1 = sh(cmd, work / f"{arm}.out", a.timeout, {**env, "TORCHINDUCTOR_CACHE_DIR": str(cache)})
        results[arm] = phases(run_dir, t0, t1, rc)
        results[arm]["writeback_after_exit"] = writeback()
        print(f"whole_run: {arm}: rc {rc}, {t1 - t0:.1f} s; its writes reached the disk {results[arm]['writeback_after_exit']:.1f} s "
              "after it exited", flush=True)
        # Keep the logs, free the disk (each run writes ~20 GB of checkpoints and exports at real size).
        logs = work / f"logs_{arm}"
        logs.mkdir(exist_ok=True)
        for name in LOG_FILES:
            if (run_dir / name).exists():
                shutil.copy(run_dir / name, logs / name)
        if not a.keep_runs:
            shutil.rmtree(run_dir, ignore_errors=True)
            os.sync()  # the delete's own journal writes, before the next arm starts
        if rc:
            print((work / f"{arm}.out").read_text(errors="replace")[-3000:])

    md = table(results, a.tiny)
    meta["command_overrides"] = a.overrides
    meta["speed"] = a.speed
    (out / "whole_run.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (out / "whole_run.md").write_text(f"# Whole run, launch to exported model\n\n{json.dumps(meta)}\n\n{md}\n")
    with tarfile.open(out / "whole_run_logs.tgz", "w:gz") as tar:
        for arm in results:
            for name in LOG_FILES:
                p = work / f"logs_{arm}" / name
                if p.exists():
                    tar.add(p, arcname=f"{arm}/{name}")
            if (work / f"{arm}.out").exists():
                tar.add(work / f"{arm}.out", arcname=f"{arm}/stdout.txt")
    print(md)
    return max((r["rc"] for r in results.values()), default=0)


if __name__ == "__main__":
    sys.exit(main())
