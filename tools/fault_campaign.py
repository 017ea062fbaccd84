#!/usr/bin/env python3
"""Kill a training run at random moments and rerun the same command: does it always come back, and to the same
weights?

A tiny CPU run of the demo model (checkpoints every few steps, validation, an average of the best checkpoints, a
FunASR export) runs once uninterrupted: the reference. Then, --kills times, the same command (with
train.resume=true, as a user reruns it) starts in a fresh folder, is killed with SIGKILL after a random delay
drawn in turn from the reference's phases (its steps, a checkpoint write, the averaging, the export: windows from
its log's timestamps), and is started again, to its end. After each kill the folder is checked: its config reads, its checkpoint
index and every checkpoint it names load (unreadable otherwise). Reported: what each run was doing when killed,
whether its rerun resumed from a checkpoint or started over, unreadable folders, and whether each rerun's export
equals the reference's bit for bit.

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
    "fun_asr_nano.encoder.output_size": 32, "fun_asr_nano.encoder.linear_units": 64, "fun_asr_nano.encoder.num_blocks": 2,
    "fun_asr_nano.encoder.tp_blocks": 1, "fun_asr_nano.adaptor.ffn_dim": 64, "fun_asr_nano.adaptor.n_layer": 1,
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
    """Each kill is a trial of its own: a fresh folder, the command killed after a random delay, then the same
    command again, to its end. The delays are drawn over the reference run from its first step to its exit, so
    they land in steps, checkpoint writes, validation, the averaging and the export."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ref = work / "reference"
    t0 = time.time()
    rc = subprocess.run(command(ref), cwd=REPO, stdout=(out / "reference.log").open("w"), stderr=subprocess.STDOUT).returncode
    wall = time.time() - t0
    if rc:
        raise SystemExit(f"fault campaign: the reference run failed (exit {rc}): see {out / 'reference.log'}")
    windows = phase_windows(ref / "train.log", t0, wall)
    first = windows["steps"][0]
    rng = random.Random(a.seed)
    rows = []
    for k in range(a.kills):
        run, log = work / f"kill{k + 1:02d}", out / f"kill{k + 1:02d}.log"
        # The phases in turn; the moment counted from this start's own first step (start-up times vary by seconds)
        delay = rng.uniform(*windows[PHASES[k % len(PHASES)]]) - first
        p = start(command(run), log)
        while p.poll() is None and "training from step" not in (run / "train.log").read_text(errors="replace") \
                if (run / "train.log").exists() else p.poll() is None:
            time.sleep(0.01)
        try:
            rc = p.wait(timeout=max(delay, 0.001))
            what = f"exited {rc} before the kill"
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
            what = "killed"
        phase = last_event(run / "train.log")
        unreadable = readable(run)
        seen = log.stat().st_size
        rerun = subprocess.run(command(run), cwd=REPO, stdout=log.open("a"), stderr=subprocess.STDOUT).returncode
        text = log.read_bytes()[seen:].decode(errors="replace")
        resumed = text.split("training from step", 1)[1].split()[0] if "training from step" in text else None
        same = rerun == 0 and equal(export_state(ref), export_state(run))
        rows.append({"kill": k + 1, "delay_s": round(delay, 2), "what": what, "during": phase,
                     "unreadable": unreadable, "rerun_exit": rerun, "rerun_from_step": resumed, "equal": same})
        print(f"fault campaign: kill {k + 1}/{a.kills} {delay:.2f} s after the first step ({what}, during: {phase}); folder "
              f"{'readable' if unreadable is None else 'UNREADABLE: ' + unreadable}; rerun exit {rerun} from step "
              f"{resumed}; export equal to the reference: {same}", flush=True)
        if same:
            shutil.rmtree(run, ignore_errors=True)
    froms = [r["rerun_from_step"] for r in rows if r["rerun_from_step"] is not None]
    return {"reference_wall_s": round(wall, 1), "first_step_s": round(first, 1), "kills": a.kills, "seed": a.seed,
            "windows_s": {k: [round(x, 3) for x in v] for k, v in windows.items()},
            "rows": rows, "reruns_resumed": sum(1 for s in froms if int(s) > 0),
            "reruns_from_step_0": sum(1 for s in froms if int(s) == 0),
            "unreadable_folders": sum(1 for r in rows if r["unreadable"]),
            "reruns_failed": sum(1 for r in rows if r["rerun_exit"] != 0),
            "final_equals_reference": all(r["equal"] for r in rows)}


PHASES = ("steps", "checkpoint writes", "averaging", "export")


def phase_windows(train_log: Path, launch: float, wall: float) -> dict[str, tuple[float, float]]:
    """Seconds after launch of each phase of the reference run, from its log's timestamps: the steps (first step to
    the end of the loop), a checkpoint write (a random one of its "checkpoint step" lines to its "saved" line), the
    averaging (the loop's end to the averaged file), the export (the average's validation to the export line)."""
    from datetime import datetime

    stamps = []
    for line in train_log.read_text(errors="replace").splitlines():
        try:
            stamps.append((datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() - launch, line))
        except ValueError:
            continue

    def at(pattern: str, default: float) -> float:
        return next((t for t, line in stamps if pattern in line), default)

    first, loop_end = at("training from step", 0.2), at("time around the steps", wall)
    averaged, exported = at("train.average_best=", loop_end), at("exported ", wall)
    writes = [t for t, line in stamps if "checkpoint step" in line]
    write = writes[len(writes) // 2] if writes else first
    return {"steps": (first, loop_end), "checkpoint writes": (write, write + 0.05), "averaging": (loop_end, averaged),
            "export": (at("validation of avg-best", averaged), exported + 0.01)}


def last_event(train_log: Path) -> str:
    """What the run was doing when it died: its log's last line, without the timestamp."""
    if not train_log.exists():
        return "start-up (no log yet)"
    lines = [x for x in train_log.read_text(errors="replace").splitlines() if x.strip()]
    return lines[-1][24:].strip()[:90] if lines else "start-up (empty log)"


def full_disk(a) -> dict:
    """The disk fills up while the run trains: train.output_dir on a tmpfs (needs root) large enough for the run's
    own estimate, then, once the run has taken its first steps, a file of zeros takes the rest of it. The run must
    stop with one line naming the disk and keep its last good checkpoint; with the space back, the same command
    resumes from it and ends."""
    mnt = Path(a.work) / "small_disk"
    mnt.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={a.disk_kb}k", "tmpfs", str(mnt)]).returncode:
        return {"skipped": "could not mount a tmpfs (needs root)"}
    try:
        run, filler = mnt / "run", mnt / "filler"
        extra = {"train.max_steps": 60, "train.keep_n": 20, "train.average_best": 0}
        log = Path(a.out) / "full_disk.log"
        p = start(command(run, extra), log)
        while p.poll() is None and not list((run / "checkpoints").glob("ckpt-*.pt")):  # its first checkpoint
            time.sleep(0.05)
        with filler.open("wb") as f:  # the rest of the disk, in 1 MB writes, until it is full
            try:
                while True:
                    f.write(b"\0" * 2**20)
                    f.flush()
            except OSError:
                pass
        rc = p.wait()
        text = log.read_text(errors="replace").splitlines()
        errors = [x for x in text if x.startswith("error:")]
        ckpts = sorted(x.name for x in (run / "checkpoints").glob("ckpt-*.pt"))
        unreadable = readable(run)
        filler.unlink()
        rerun = subprocess.run(command(run, extra), cwd=REPO, capture_output=True, text=True)
        resumed = rerun.stdout.split("training from step", 1)[1].split()[0] if "training from step" in rerun.stdout else None
        return {"tmpfs_kb": a.disk_kb, "exit": rc, "error_lines": errors, "checkpoints_left": ckpts,
                "unreadable": unreadable, "rerun_exit": rerun.returncode, "rerun_from_step": resumed,
                "tail": text[-4:]}
    finally:
        subprocess.run(["umount", str(mnt)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/faults")
    ap.add_argument("--work", default="/tmp/brisk_faults")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full-disk", action="store_true", help="also the full-disk run (a tmpfs: needs root)")
    ap.add_argument("--disk-kb", type=int, default=60000, help="the tmpfs's size for --full-disk (above the run's own "
                    "estimate, or it is refused at the start)")
    a = ap.parse_args()
    result = campaign(a)
    if a.full_disk:
        result["full_disk"] = full_disk(a)
    out = Path(a.out)
    (out / "faults.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Fault campaign: {a.kills} SIGKILLs of a tiny CPU run, each followed by the same command", "",
             "| kill | after its first step | during (the log's last line) | folder | rerun | from step | export equal |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kill']} | {r['delay_s']} s | {r['during']} | "
              f"{'readable' if r['unreadable'] is None else 'UNREADABLE: ' + r['unreadable']} | exit {r['rerun_exit']} | "
              f"{r['rerun_from_step']} | {r['equal']} |" for r in result["rows"]]
    lines += ["", f"- reference run: {result['reference_wall_s']} s uninterrupted ({result['first_step_s']} s to its first "
              f"step); kill moments drawn in turn from its phases' windows (seconds after launch: {result['windows_s']}), each counted "
              "from the killed start's own first step",
              f"- reruns that resumed from a checkpoint: {result['reruns_resumed']}; started at step 0: "
              f"{result['reruns_from_step_0']}; failed: {result['reruns_failed']}",
              f"- unreadable run folders after a kill: {result['unreadable_folders']}",
              f"- every rerun's export equals the reference's bit for bit: {result['final_equals_reference']}"]
    if "full_disk" in result:
        lines += ["", "## Full disk", "", "```", json.dumps(result["full_disk"], indent=1), "```"]
    (out / "faults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    ok = result["unreadable_folders"] == 0 and result["final_equals_reference"] and not result["reruns_failed"]
    if "full_disk" in result and "skipped" not in result["full_disk"]:
        fd = result["full_disk"]
        ok &= fd["exit"] != 0 and len(fd["error_lines"]) == 1 and fd["unreadable"] is None and fd["rerun_exit"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
