"""A run's state, in one place: which checkpoint a run continues from, checked against the new config, restored.

`brisk train` calls this module twice, in this order:

    check(cfg, rank) -> allowed changes       before the run folder is locked, logged to or rewritten
    resume(cfg, parts, ckpts, run_dir) -> Position
        choose(cfg, ckpts)                    the checkpoint: train.resume_from, else the latest intact one
        restore(parts, path)                  model, optimizer, schedule, every rank's RNG, position in the data
        report(cfg, run_dir, path, step)      what the resume did: nothing to resume, config changes, log lines
                                              past the checkpoint dropped

A resume may change where and how long a run goes (RESUME_HARMLESS: max_steps, max_epochs, logging, validation
cadence, checkpoint keeping, ...): those changes are logged. It may not change the model's shapes or the data it
learns from (brisk.formats.run_config.refused): one ConfigError line naming the keys, raised before the folder is
touched, so a refused resume leaves it byte-identical. Other changes (optimizer, speed switches) are allowed and
warned about. What a checkpoint holds is written by Trainer.state (trainer.py) and read back here.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config, ConfigError, config_changes
from ..config.migrate import read_moved
from ..config.roles import resume_roles
from ..distributed.ranks import broadcast_from_rank0
from ..formats.run_config import changes, checkpoint_config, describe, refused, saved_config
from ..models.build import read_checkpoint
from .checkpoint import Checkpoints, set_rng_state
from .optim import load_optimizer_state

log = logging.getLogger("brisk")

# Keys whose change between a checkpoint and its resume is expected (where and how long, not what is computed).
RESUME_HARMLESS = {"train.resume", "train.resume_from", "train.overwrite", "train.output_dir", "train.max_steps",
                   "train.max_epochs", "train.progress", "train.tensorboard", "train.log_every", "train.save_every",
                   "train.val_every", "train.val_decode", "train.val_decode_fast", "train.keep_n", "train.keep_metric",
                   "train.save_final", "train.export", "train.export_dtype", "train.gc_every", "train.cpu_threads",
                   "train.async_checkpoint", "data.num_workers", "data.pin_memory", "diagnose.report",
                   "diagnose.slow_factor", "diagnose.warmup_steps", "diagnose.window", "probe.enabled"}
STEP_LOGS = ("steps.jsonl", "slow_steps.jsonl", "history.jsonl", "metrics.jsonl")  # one line a step (or a check)


@dataclass
class Position:
    step: int = 0  # optimizer steps done
    epoch: int = 0
    batches_in_epoch: int = 0  # batches of this epoch already trained on (resume skips them)
    bad_samples: int = 0
    empty_batches: int = 0
    history: list[dict] = field(default_factory=list)  # validation results
    clip_norm: float = 0.0  # speed.clip_by_previous_norm: the norm the next step clips by (0: none)


# ------------------------------------------------------------------------------- before the folder is touched
def check_resume(run_dir: str | Path, now: dict, resume_from: str | None = None) -> list[str]:
    """Refuse (one ConfigError line) a resume whose config changes the model's shapes or the data; return the
    allowed changes ('key: old -> new') among RESUME_HARMLESS for the log. Reads only."""
    run_dir = Path(run_dir)
    if not resume_from and not any((run_dir / "checkpoints").glob("ckpt-*.pt")):
        return []  # nothing to resume: the run starts fresh (a failed start's files are cleared)
    saved, source = saved_config(run_dir, resume_from)
    if saved is None:
        return []
    diff = changes(read_moved(saved, source), now)  # an older brisk's keys under their new names
    roles = resume_roles()
    bad = {k: v for k, v in diff.items() if refused(k, roles)}
    if bad:
        raise ConfigError(
            f"train.resume: {run_dir} was trained with another model or data ({source.name}); refused, nothing in the "
            f"folder changed: {describe(bad)}. Give the run's own values, or start a new run (another "
            "train.output_dir, or train.overwrite=true to replace this one)")
    quiet = {"train.resume", "train.resume_from", "train.overwrite"}  # the resume itself
    return [f"{k}: {old!r} -> {new!r}" for k, (old, new) in diff.items() if k in RESUME_HARMLESS - quiet]


def check(cfg: Config, rank: int = 0) -> list[str]:
    """A resume's config checked against the run's (check_resume); the allowed changes are logged."""
    t = cfg.train
    if not (t.resume or t.resume_from):
        return []
    allowed = check_resume(t.output_dir, cfg.to_dict(), t.resume_from)
    if allowed and rank == 0:
        log.info("resume: %d allowed change%s: %s", len(allowed), "" if len(allowed) == 1 else "s", "; ".join(allowed))
    return allowed


# ------------------------------------------------------------------------------------------ the resume
def resume(cfg: Config, parts, ckpts: Checkpoints | None, run_dir: Path) -> Position:
    """Where the run continues from: a chosen checkpoint restored (every rank loads the same file), and what that
    did reported; a fresh Position when there is nothing to resume."""
    path = choose(cfg, ckpts)
    pos = restore(parts, path) if path is not None else Position()
    if parts.ranks.rank == 0:
        report(cfg, run_dir, path, pos.step)
    return pos


def choose(cfg: Config, ckpts: Checkpoints | None) -> Path | None:
    """The checkpoint to resume from: chosen by rank 0 (it holds the checkpoint list), the same on every rank."""
    path = None
    if cfg.train.resume_from:
        path = Path(cfg.train.resume_from)
    elif cfg.train.resume and ckpts is not None:
        path = ckpts.latest_intact()
    path = broadcast_from_rank0(str(path) if path else None)
    return Path(path) if path else None


def restore(parts, path: Path) -> Position:
    """Load a brisk checkpoint into the run's model, optimizer, schedule and RNGs; every rank calls this with
    the same file. Returns the position in the run to continue from."""
    ckpt = read_checkpoint(path)  # merges frozen weights stored once (train.frozen_ref)
    if "trainer" not in ckpt:
        raise ConfigError(f"{path}: not a brisk checkpoint (no trainer state); use model.init to start from its weights")
    if parts.sharded:
        from ..distributed.fsdp import load_full_state

        load_full_state(parts.model, parts.optimizer, ckpt["state_dict"], ckpt["optimizer"])
    else:
        parts.model.load_state_dict(ckpt["state_dict"])
        load_optimizer_state(parts.optimizer, ckpt["optimizer"])
    if parts.accel.audio is not None:
        parts.accel.audio.refresh()  # compute copies of the frozen encoder follow the loaded weights
    parts.schedule.load_state_dict(ckpt["schedule"])
    t = ckpt["trainer"]
    rank = parts.ranks.rank
    rngs = ckpt.get("rng_ranks", [ckpt["rng"]])
    if rank < len(rngs):
        set_rng_state(rngs[rank])
    else:
        log.warning("%s holds RNG states of %d ranks; rank %d keeps its fresh seed", path, len(rngs), rank)
    log.info("resumed from %s at step %d (epoch %d, batch %d of the epoch)", path, t["step"], t["epoch"], t["batches_in_epoch"])
    return Position(t["step"], t["epoch"], t["batches_in_epoch"], t.get("bad_samples", 0), 0, t.get("history", []),
                    t.get("clip_norm", 0.0))


# ------------------------------------------------------------------------------------------ what it did
def report(cfg: Config, run_dir: Path, path: Path | None, step: int) -> None:
    """Say what a resume did (rank 0): nothing to resume, config changes, log lines past the checkpoint dropped."""
    if path is None:
        if cfg.train.resume:
            log.info("train.resume=true: nothing to resume in %s (no checkpoint), starting fresh", run_dir)
            trim_step_logs(run_dir, 0)  # steps of a run killed before its first checkpoint
        return
    saved = checkpoint_config(path)
    # an older brisk's names read as the new ones (check_resume said so once already)
    warn_config_changes(read_moved(saved, path, say=False) if saved is not None else None, cfg.to_dict(), path)
    trim_step_logs(run_dir, step)


def warn_config_changes(saved: dict | None, now: dict, path: Path) -> list[str]:
    found = config_changes(saved or {}, now, RESUME_HARMLESS) if saved is not None else []
    if found:
        log.warning("resuming %s with a config that differs from the checkpoint's in %d key%s: %s", path.name,
                    len(found), "" if len(found) == 1 else "s", "; ".join(found))
    return found


def trim_step_logs(run_dir: Path, step: int) -> int:
    """Drop the log lines past ``step`` (the checkpoint resumed from); returns how many were dropped."""
    dropped = 0
    for name in STEP_LOGS:
        f = run_dir / name
        if not f.exists():
            continue
        keep = []
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                ok = int(json.loads(line).get("step", 0)) <= step
            except (ValueError, AttributeError):
                ok = False  # a line cut short by the kill
            if ok:
                keep.append(line)
            else:
                dropped += 1
        f.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
    if dropped:
        log.info("resume: dropped %d log lines past step %d (written after the last checkpoint)", dropped, step)
    return dropped
