"""torch.load for files that are data, never code.

A ``.pt`` file is a pickle: opened with ``weights_only=False`` it can run any command its author chose. brisk
opens every one (a FunASR ``model.pt``, ``model.init``, its own checkpoints, eval's folders) with
``weights_only=True``: tensors, containers and numbers only. brisk's own checkpoints hold nothing else (RNG
states are written as plain values, see brisk.train.checkpoint.rng_state); the one allowance is numpy's
array reconstruction, for the numpy RNG state that checkpoints written before this rule carry (a uint32
array: numpy.ndarray, its dtype and numpy's ``_reconstruct``; an array of Python objects is still refused).
A file that needs anything else is refused with one line that names it and the global it asked for, before
any of it runs.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import torch

from .errors import ConfigError


def _numpy_array_globals() -> list:
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed the module; pickles name either
    return [np.ndarray, np.dtype, core.multiarray._reconstruct, type(np.dtype(np.uint32))]


ALLOWED = _numpy_array_globals()


class UnsafeFileError(ConfigError):
    """A torch file that needs more than tensors and plain values to load; nothing in it was run."""


def _refusal(path: Path, e: Exception) -> str:
    text = str(e)
    # torch's message names what it refused: "unsupported GLOBAL posix.system", "Unsupported global: GLOBAL x.y",
    # "... but got <class 'x.Y'>", or a pickle instruction it does not read ("Unsupported operand 149").
    m = re.search(r"GLOBAL ([\w.]+)|but got (<[^>]+>)|Unsupported (operand \d+)", text)
    wanted = next((g for g in m.groups() if g), "") if m else ""
    what = f" (it asks for {wanted})" if wanted else ""
    return (f"{path}: refused: not plain weights{what}; brisk opens .pt files as data only (torch.load "
            "weights_only=True), so nothing in it was run. Convert it where you trust it: "
            "torch.save({'state_dict': model.state_dict()}, 'model.pt'), or use .safetensors")


def load_torch_file(path: str | Path, mmap: bool = True):
    """torch.load(path) with weights_only=True on the CPU; ``mmap``: tensors are read from the page cache
    when they are used (a legacy pre-zip file cannot be mapped and is read whole)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist" if not path.exists() else f"{path} is not a file")
    try:
        with torch.serialization.safe_globals(ALLOWED):
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            except RuntimeError as e:
                if not mmap or "mmap" not in str(e):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeFileError(_refusal(path, e)) from None
