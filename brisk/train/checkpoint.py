"""Checkpoints: atomic writes, keep-n-best, exact resume.

A checkpoint is one file, ``checkpoints/ckpt-<step>.pt``: FunASR's {"state_dict": ...} layout (so FunASR
loads it as is) plus what an exact resume needs: optimizer, schedule, trainer position (epoch, batches
of the epoch already used), RNG states (of every rank: ``rng_ranks``), and the resolved config. Each file is
written to a temporary name in the same folder, fsynced, renamed, and the folder fsynced, so a crash leaves
the previous checkpoints intact; temporary files a crash left behind are removed at the next start. A write
that would not fit in the free space is refused before it starts. index.json (also written atomically) lists
the checkpoints and their validation metrics; after each save only the keep_n best by the chosen metric and
the latest remain, so a run holds at most keep_n + 2 checkpoints at once (the new one before pruning).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from ..formats.run_folder import ranked

from ..files import atomic_save, gb, tensor_bytes, write_json_atomic
from ..models.build import STALE_TEMPS
from ..safe_load import UnsafeFileError, load_torch_file

log = logging.getLogger("brisk")


def rng_state() -> dict:
    """Every generator's state as tensors and plain values, so a checkpoint loads with weights_only=True."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy = (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state






def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]  # keys: a tensor (plain values), or numpy's array in older checkpoints
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def remove_stale_temps(run_dir: Path) -> list[Path]:
    """Temporary files of writes a crash interrupted (never renamed into place): safe to delete at start."""
    found = [p for pat in STALE_TEMPS for p in run_dir.glob(pat)]
    ck = run_dir / "checkpoints"
    found += [p for pat in (".*.pt.*", ".index.json.*") for p in ck.glob(pat)]  # checkpoints, frozen-weight files
    for p in found:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        log.info("removed %s, left behind by an interrupted write", p)
    return found


def disk_footprint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoints: int,
                   export: bool) -> tuple[int, str]:
    """Bytes a run's writes need at most: ``checkpoints`` files held at once (weights + AdamW's two moments
    of every trainable parameter), plus the export folder (weights at most in fp32). Returns (bytes, breakdown)."""
    weights = tensor_bytes(model.state_dict())
    moments = 2 * sum(p.numel() * p.element_size() for g in optimizer.param_groups for p in g["params"])
    ckpt = int((weights + moments) * 1.01) + (1 << 20)  # + steps, RNG, config, pickle framing
    need = checkpoints * ckpt + (weights if export else 0)
    what = f"{checkpoints} checkpoint(s) of {gb(ckpt)} held at once" + (f" + an export of {gb(weights)}" if export else "")
    return need, what




class Checkpoints:
    def __init__(self, run_dir: Path, keep_n: int, metric: str):
        self.dir = run_dir / "checkpoints"
        self.dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(run_dir)
        self.keep_n, self.metric = keep_n, metric
        self.index_path = self.dir / "index.json"
        self.index: dict[str, dict] = json.loads(self.index_path.read_text()) if self.index_path.exists() else {}

    def save(self, state: dict, step: int, val: dict | None, sync: bool = True) -> Path:
        """``sync``: durable before returning; else atomic now and fsynced in the background (brisk.files)."""
        name = f"ckpt-{step:08d}.pt"
        path = self.dir / name
        atomic_save(state, path, sync)
        self.index[name] = {"step": step, **({f"val_{k}": v for k, v in val.items()} if val else {})}
        self._prune(latest=name)
        write_json_atomic(self.index, self.index_path, sync)
        return path

    def _prune(self, latest: str) -> None:
        scored = ranked(self.index, self.metric)
        keep = set(scored[: self.keep_n]) | {latest}
        if not scored:  # no validation metric yet: keep the most recent keep_n
            keep |= set(sorted(self.index)[-self.keep_n:])
        for name in list(self.index):
            if name not in keep:
                (self.dir / name).unlink(missing_ok=True)
                del self.index[name]

    def best(self) -> Path | None:
        scored = ranked(self.index, self.metric)
        return self.dir / scored[0] if scored else None

    def latest(self) -> Path | None:
        names = sorted(n for n in self.index if (self.dir / n).exists())
        return self.dir / names[-1] if names else None

    def latest_intact(self) -> Path | None:
        """The newest checkpoint whose file opens whole. Only a power loss or OS crash can leave a torn one
        (writes are atomic for the process; the background fsync may not have finished): it is skipped,
        with a warning, for the one before it."""
        for name in sorted((n for n in self.index if (self.dir / n).exists()), reverse=True):
            try:
                load_torch_file(self.dir / name)
                return self.dir / name
            except UnsafeFileError:
                raise  # whole, but not plain data: never fall back past it silently
            except Exception as e:  # noqa: BLE001 - any reader error means the file is not whole
                log.warning("%s is incomplete (%s: %s); trying the checkpoint before it", self.dir / name,
                            type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None
