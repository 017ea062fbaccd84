"""Checkpoints: atomic writes, keep-n-best, exact resume.

A checkpoint is one file, ``checkpoints/ckpt-<step>.pt``: FunASR's {"state_dict": ...} layout (so FunASR
loads it as is) plus what an exact resume needs: optimizer, schedule, trainer position (epoch, batches
of the epoch already used), RNG states, and the resolved config. Each file is written to a temporary name
in the same folder, fsynced and renamed, so a crash leaves the previous checkpoints intact. index.json
(also written atomically) lists the checkpoints and their validation metrics; after each save only the
keep_n best by the chosen metric and the latest remain.
"""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..models.build import atomic_save

log = logging.getLogger("brisk")


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_json_atomic(obj, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Checkpoints:
    def __init__(self, run_dir: Path, keep_n: int, metric: str):
        self.dir = run_dir / "checkpoints"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep_n, self.metric = keep_n, metric
        self.index_path = self.dir / "index.json"
        self.index: dict[str, dict] = json.loads(self.index_path.read_text()) if self.index_path.exists() else {}

    def save(self, state: dict, step: int, val: dict | None) -> Path:
        name = f"ckpt-{step:08d}.pt"
        path = self.dir / name
        atomic_save(state, path)
        self.index[name] = {"step": step, **({f"val_{k}": v for k, v in val.items()} if val else {})}
        self._prune(latest=name)
        _write_json_atomic(self.index, self.index_path)
        return path

    def _score(self, entry: dict) -> float | None:
        v = entry.get(f"val_{self.metric}")
        if v is None:
            return None
        return -v if self.metric == "acc" else v  # lower is better

    def _prune(self, latest: str) -> None:
        scored = sorted((s, n) for n, e in self.index.items() if (s := self._score(e)) is not None)
        keep = {n for _, n in scored[: self.keep_n]} | {latest}
        if not scored:  # no validation metric yet: keep the most recent keep_n
            keep |= set(sorted(self.index)[-self.keep_n:])
        for name in list(self.index):
            if name not in keep:
                (self.dir / name).unlink(missing_ok=True)
                del self.index[name]

    def best(self) -> Path | None:
        scored = sorted((s, n) for n, e in self.index.items() if (s := self._score(e)) is not None)
        return self.dir / scored[0][1] if scored else None

    def latest(self) -> Path | None:
        names = sorted(n for n in self.index if (self.dir / n).exists())
        return self.dir / names[-1] if names else None
