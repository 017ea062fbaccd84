#!/usr/bin/env python3
"""Kill a training run at random moments and rerun the same command: does it always come back, and to the same
weights?

A tiny CPU run of the demo model (checkpoints every few steps, validation, an average of the best checkpoints, a
FunASR export) runs once uninterrupted: the reference. Then the same command (with train.resume=true, as a user
reruns it) is started, killed with SIGKILL after a random delay inside the reference's wall time (during steps,
checkpoint writes, the averaging or the export), and started again, --kills times; the last start runs to its end.
After every kill the run folder is checked: its config reads, its checkpoint index and every checkpoint it names
load (unreadable otherwise). Reported: the kills, how many reruns resumed from a checkpoint and how many started
over, unreadable folders, and whether the final export equals the reference's bit for bit.

--full-disk runs the same command with the disk filling up: train.output_dir on a small tmpfs (needs root), filled
until a checkpoint write fails; the run must stop with one line naming the disk and keep its last good checkpoint.

    python tools/fault_campaign.py --out bench/results/DATE-cpu-faults            # 20 kills
    python tools/fault_campaign.py --kills 3 --out /tmp/faults                     # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TINY = {  # tests/conftest.py's tiny demo model, on the 240 base utterances
    "model.encoder.output_size": 32, "model.encoder.linear_units": 64, "model.encoder.num_blocks": 2,
    "model.encoder.tp_blocks": 1, "model.adaptor.ffn_dim": 64, "model.adaptor.n_layer": 1,
    "model.llm.config.hidden_size": 32, "model.llm.config.intermediate_size": 64,
    "model.llm.config.num_attention_heads": 2, "model.llm.config.num_key_value_heads": 1,
    "model.llm.config.head_dim": 16, "data.train": "data/demo/train.jsonl", "data.num_workers": 0,
    "train.progress": False, "train.tensorboard": False, "diagnose.report": False,
    "train.max_steps": 40, "train.log_every": 2, "train.save_every": 5, "train.val_every": 10, "train.keep_n": 3,
    "train.val_decode": 4, "train.average_best": 2, "train.export": "funasr", "train.resume": True,
}


def command(run: Path, extra: dict | None = None) -> list[str]:
    items = {**TINY, **(extra or {}), "train.output_dir": str(run)}
    return [sys.executable, "-m", "brisk", "train", "configs/demo.yaml",
            *[f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in items.items()]]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT, cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def readable(run: Path) -> str | None:
    """None when the run folder reads back (config, checkpoint index, every checkpoint it names), else why not."""
    import yaml

    from brisk.models.build import read_checkpoint

    if not run.exists():
        return None  # nothing written yet: a fresh start
    try:
        if (run / "config.yaml").exists():
            yaml.safe_load((run / "config.yaml").read_text())
        index = run / "checkpoints" / "index.json"
        names = list(json.loads(index.read_text())) if index.exists() else []
        for name in names:
            read_checkpoint(run / "checkpoints" / name)
    except Exception as e:  # noqa: BLE001 - any failure to read is the finding
        return f"{type(e).__name__}: {e}"
    return None


def export_state(run: Path) -> dict:
    from brisk.models.build import read_state_dict

    return read_state_dict(run / "model-funasr" / "model.pt")


def equal(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def campaign(a) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ref, run = work / "reference", work / "killed"
    t0 = time.time()
    rc = subprocess.run(command(ref), cwd=REPO, stdout=(out / "reference.log").open("w"), stderr=subprocess.STDOUT).returncode
    wall = time.time() - t0
    if rc:
        raise SystemExit(f"fault campaign: the reference run failed (exit {rc}): see {out / 'reference.log'}")
    rng = random.Random(a.seed)
    log = out / "killed.log"
    rows = []
    for k in range(a.kills):
        delay = rng.uniform(0.2, wall)
        seen = log.stat().st_size if log.exists() else 0  # this start's lines come after
        p = start(command(run), log)
        try:
            rc = p.wait(timeout=delay)
            what = f"exited {rc} before the kill"
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
            what = "killed"
        text = log.read_bytes()[seen:].decode(errors="replace")
        last_start = text.rsplit("training from step", 1)
        started_at = int(last_start[1].split()[0]) if len(last_start) == 2 else None
        rows.append({"kill": k + 1, "delay_s": round(delay, 2), "what": what, "started_at_step": started_at,
                     "unreadable": readable(run)})
        print(f"fault campaign: kill {k + 1}/{a.kills} after {delay:.1f} s: {what}, that start began at step "
              f"{started_at}; folder {'readable' if rows[-1]['unreadable'] is None else rows[-1]['unreadable']}",
              flush=True)
    final = subprocess.run(command(run), cwd=REPO, stdout=log.open("a"), stderr=subprocess.STDOUT).returncode
    starts = [r["started_at_step"] for r in rows if r["started_at_step"] is not None]
    result = {"reference_wall_s": round(wall, 1), "kills": a.kills, "seed": a.seed, "rows": rows, "final_exit": final,
              "reruns_resumed": sum(1 for s in starts if s > 0), "reruns_from_step_0": sum(1 for s in starts if s == 0),
              "unreadable_folders": sum(1 for r in rows if r["unreadable"]),
              "final_equals_reference": final == 0 and equal(export_state(ref), export_state(run))}
    return result


def full_disk(a) -> dict:
    """train.output_dir on a tmpfs too small for the run's checkpoints: the run must stop with one line about the
    disk, its last good checkpoint readable."""
    mnt = Path(a.work) / "small_disk"
    mnt.mkdir(parents=True, exist_ok=True)
    size = a.disk_kb
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", str(mnt)]).returncode:
        return {"skipped": "could not mount a tmpfs (needs root)"}
    try:
        run = mnt / "run"
        res = subprocess.run(command(run, {"train.max_steps": 60, "train.keep_n": 20, "train.average_best": 0}),
                             cwd=REPO, capture_output=True, text=True)
        errors = [x for x in res.stderr.splitlines() + res.stdout.splitlines() if x.startswith("error:")]
        ckpts = sorted((run / "checkpoints").glob("ckpt-*.pt")) if run.exists() else []
        return {"tmpfs_kb": size, "exit": res.returncode, "error_lines": errors, "checkpoints_left": len(ckpts),
                "unreadable": readable(run), "tail": res.stdout.splitlines()[-5:] + res.stderr.splitlines()[-5:]}
    finally:
        subprocess.run(["umount", str(mnt)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/faults")
    ap.add_argument("--work", default="/tmp/brisk_faults")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full-disk", action="store_true", help="also the full-disk run (a tmpfs: needs root)")
    ap.add_argument("--disk-kb", type=int, default=20000, help="the tmpfs's size for --full-disk")
    a = ap.parse_args()
    result = campaign(a)
    if a.full_disk:
        result["full_disk"] = full_disk(a)
    out = Path(a.out)
    (out / "faults.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Fault campaign: {a.kills} SIGKILLs of a tiny CPU run, then the same command to its end", "",
             "| kill | after | what | that start began at step | folder |", "|---|---|---|---|---|"]
    lines += [f"| {r['kill']} | {r['delay_s']} s | {r['what']} | {r['started_at_step']} | "
              f"{'readable' if r['unreadable'] is None else 'UNREADABLE: ' + r['unreadable']} |" for r in result["rows"]]
    lines += ["", f"- reference run: {result['reference_wall_s']} s uninterrupted",
              f"- reruns that resumed from a checkpoint: {result['reruns_resumed']}; started at step 0: "
              f"{result['reruns_from_step_0']}",
              f"- unreadable run folders after a kill: {result['unreadable_folders']}",
              f"- final run exit {result['final_exit']}; its export equals the reference's bit for bit: "
              f"{result['final_equals_reference']}"]
    if "full_disk" in result:
        lines += ["", "## Full disk", "", "```", json.dumps(result["full_disk"], indent=1), "```"]
    (out / "faults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    ok = result["unreadable_folders"] == 0 and result["final_equals_reference"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
