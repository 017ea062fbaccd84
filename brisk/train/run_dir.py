"""Run folders that never mix: one run a folder, resume only on request, logs without repeated steps.

A folder "holds a run" when it has any of the files a run writes and a checkpoint or exported weights.
Training into such a folder is refused unless train.resume=true (continue it) or train.overwrite=true
(delete that run's files first, and only those). A start that failed before its first checkpoint (a data
mistake, a Ctrl-C while loading) is not a run: its files are removed, with one line saying so, so the
same command works once the mistake is fixed. While a process trains, it holds an exclusive lock on
``.brisk.lock`` in the folder: a second process into the same folder is refused, even with
train.overwrite=true. A resume keeps every file; what it reads, checks, restores and trims is
brisk.train.run_state's.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from pathlib import Path

from ..config import Config, ConfigError

log = logging.getLogger("brisk")

RUN_FILES = ("config.yaml", "accel.json", "steps.jsonl", "slow_steps.jsonl", "history.jsonl", "metrics.jsonl",
             "train.log", "report.md", "report.png", "model.pt", "model.safetensors")
RUN_DIRS = ("checkpoints", "tb")
LOCK = ".brisk.lock"  # held (flock) by the process training in the folder; left in place once a run has started


def demo_dir(root: Path | None = None) -> Path:
    """A fresh folder for one demo run: ./runs/demo-YYYYmmdd-HHMMSS (-2, -3, ... within the same second),
    created here so that two demos started together cannot pick the same one."""
    base = (root or Path.cwd()) / "runs" / time.strftime("demo-%Y%m%d-%H%M%S")
    base.parent.mkdir(parents=True, exist_ok=True)
    path, n = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


def holds_run(folder: Path) -> list[str]:
    """The run files and folders present in ``folder`` (empty: no run there)."""
    found = [n for n in RUN_FILES + RUN_DIRS if (folder / n).exists()]
    return found + sorted(p.name for p in folder.glob("probe.rank*.jsonl"))


def reached_checkpoint(folder: Path) -> bool:
    """Whether a run in ``folder`` wrote anything worth keeping: a checkpoint or exported weights."""
    ck = folder / "checkpoints"
    return (any(ck.glob("ckpt-*.pt")) or (folder / "model.pt").exists() or (folder / "model.safetensors").exists()
            or any(p.is_dir() for p in folder.glob("model-*")))


def prepare(cfg: Config, rank: int = 0) -> Path:
    """Check (and with train.overwrite clear) the run folder before anything is written to it."""
    t = cfg.train
    run_dir = Path(t.output_dir)
    found = holds_run(run_dir) if run_dir.is_dir() else []
    fresh = not (t.resume or t.resume_from)  # a resume keeps every file (run_state.report trims the step logs)
    if not (found and fresh):
        found = []
    elif not reached_checkpoint(run_dir):
        log.info("train.output_dir=%s held a start that never reached its first checkpoint (%s): removed those "
                 "files, starting fresh", run_dir, ", ".join(found))
    elif not t.overwrite:
        raise ConfigError(f"train.output_dir={run_dir} already holds a run ({', '.join(found[:4])}): continue it with "
                          "train.resume=true, replace it with train.overwrite=true, or choose another train.output_dir")
    if rank != 0:
        found = []
    for name in found:
        p = run_dir / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def make_output_dir(run_dir: Path) -> None:
    """Create the run folder; a place that cannot hold one is a one-line ConfigError naming the key."""
    real = run_dir.resolve()
    if real.parts[1:2] in (("proc",), ("sys",), ("dev",)):
        raise ConfigError(f"train.output_dir={run_dir} is under /{real.parts[1]}, a kernel filesystem that holds no "
                          "files of ours; choose a folder on a disk")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"train.output_dir={run_dir} is a file, not a folder; choose another train.output_dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"train.output_dir={run_dir}: cannot write there ({e.strerror or e}); choose another "
                          "train.output_dir") from None


@contextlib.contextmanager
def run_lock(output_dir: str | Path, rank: int = 0):
    """Hold ``.brisk.lock`` in the run folder for the whole run (rank 0; the other ranks share its folder).

    The lock is taken before the folder is checked, so a second process never clears or mixes into the files
    of one still training. It is released when the run ends, and by the OS when the process dies."""
    if rank != 0:
        yield
        return
    run_dir = Path(output_dir)
    before = set(os.listdir(run_dir)) if run_dir.is_dir() else None  # None: this process makes the folder
    make_output_dir(run_dir)
    f = open(run_dir / LOCK, "a+", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise ConfigError(f"train.output_dir={run_dir} is in use: brisk process {holder} is training there (it holds "
                          f"{run_dir / LOCK}); wait for it to end or choose another train.output_dir "
                          "(train.overwrite=true does not apply to a folder in use)") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    try:
        yield
    except BaseException:
        _release(f)
        if not started(run_dir):
            _remove_failed_start(run_dir, before)
        raise
    _release(f)


def _release(f) -> None:
    f.truncate(0)
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()


def started(folder: Path) -> bool:
    """Whether a run in ``folder`` took a step (its step log has a line) or wrote a checkpoint."""
    steps = folder / "steps.jsonl"
    return reached_checkpoint(folder) or (steps.is_file() and steps.stat().st_size > 0)


def _remove_failed_start(run_dir: Path, before: set[str] | None) -> None:
    """A start that failed before its first step leaves nothing: the folder it made, or in a folder that was there
    already the files it wrote (a config mistake, a refused combination, a Ctrl-C while loading)."""
    if before is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name in set(os.listdir(run_dir)) - before:
        p = run_dir / name
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
