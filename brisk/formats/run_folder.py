"""What a folder is (a brisk run, a FunASR model folder, a native HF folder) and which weights a run holds."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..errors import ConfigError


def ranked(index: dict[str, dict], metric: str) -> list[str]:
    """Names of the checkpoints in ``index`` that carry validation ``metric``, best first (loss: lowest)."""
    sign = -1 if metric == "acc" else 1
    return [n for _, n in sorted((sign * e[f"val_{metric}"], n) for n, e in index.items() if f"val_{metric}" in e)]


# ------------------------------------------------------------------------------------------ loading
def folder_kind(path: str | Path) -> str:
    """'run' (a brisk run folder), 'funasr' (FunASR model folder, config.yaml) or 'transformers' (a transformers
    folder, config.json: which family's, brisk.families.folder_family says from its model_type)."""
    path = Path(path)
    cfg_file = path / "config.yaml"
    raw = (yaml.safe_load(cfg_file.read_text(encoding="utf-8")) or {}) if cfg_file.is_file() else None
    if isinstance(raw, dict) and isinstance(raw.get("model"), dict):
        return "run"
    if (path / "config.json").is_file():
        return "transformers"
    if raw is not None:
        return "funasr"
    raise ConfigError(f"{path}: not a brisk run folder, a FunASR model folder (config.yaml) or a transformers model "
                      "folder (config.json)")


def run_weights(run_dir: Path, which: str | None = None, metric: str = "loss") -> Path | None:
    """A run's weights. ``which``: a file; "best" (by ``metric``) or "last" (checkpoints); None: the newest
    weights, its last checkpoint (full precision), else its exported FunASR model.pt."""
    if which not in (None, "best", "last"):
        return Path(which)
    folder = run_dir / "checkpoints"
    index = json.loads((folder / "index.json").read_text()) if (folder / "index.json").is_file() else {}
    present = sorted(n for n in index if (folder / n).is_file()) or sorted(p.name for p in folder.glob("ckpt-*.pt"))
    if which == "best":
        scored = ranked({n: index[n] for n in present if n in index}, metric)
        if scored:
            return folder / scored[0]
    if present:
        return folder / present[-1]
    if which is None:
        for p in (run_dir / "model-funasr" / "model.pt", run_dir / "model.pt"):
            if p.is_file():
                return p
    raise FileNotFoundError(f"{run_dir}: no weights ({'checkpoints/' if which else 'checkpoints/ or model-funasr/model.pt'})")


def describe_weights(run_dir: Path, used: Path | None, metric: str = "loss") -> str:
    """Which weights a run's evaluation used, and which checkpoint is the best by validation ``metric``."""
    folder = run_dir / "checkpoints"
    index = json.loads((folder / "index.json").read_text()) if (folder / "index.json").is_file() else {}
    scored = ranked({n: e for n, e in index.items() if (folder / n).is_file()}, metric)
    if not scored:
        return f"weights: {used} (no checkpoint has a validation {metric} to rank by)"
    best, value = folder / scored[0], index[scored[0]][f"val_{metric}"]
    if used is not None and Path(used).resolve() == best.resolve():
        return f"weights: {used} (the best checkpoint by validation {metric}, {value:.4f})"
    return f"weights: {used}; the best checkpoint by validation {metric} ({value:.4f}) is {best} (--weights best)"
