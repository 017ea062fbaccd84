"""Reading audio: soundfile (wav, flac, ogg, ...), mono, resampled to the front end's rate."""

from __future__ import annotations

import math
import os
from functools import lru_cache

import soundfile as sf
import torch
import torch.nn.functional as F


class AudioError(ValueError):
    """An audio file is missing, unreadable or empty; the message names it."""


def read_audio(path: str, fs: int, notes: list[tuple[str, str]] | None = None) -> torch.Tensor:
    """-> float32 mono waveform [S] in [-1, 1] at ``fs`` Hz; each conversion done is appended to ``notes`` as (what, path)."""
    if not os.path.isfile(path):
        raise AudioError(f"audio file {path} is a folder, not a file" if os.path.isdir(path) else f"audio file {path} not found")
    try:
        data, rate = sf.read(path, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as e:
        raise AudioError(f"audio file {path} could not be read: {e}") from None
    # FunASR averages channels. A mono file's one column is taken as it is (the same values): readers run on
    # threads (brisk.eval.decode), and a torch op there would start an intra-op thread team in every reader.
    wave = torch.from_numpy(data[:, 0]) if data.shape[1] == 1 else torch.from_numpy(data).mean(dim=1)
    if wave.numel() == 0:
        raise AudioError(f"audio file {path} has no samples")
    if notes is not None and data.shape[1] > 1:
        notes.append((f"down-mixed from {data.shape[1]} channels to mono", path))
    if rate != fs:
        wave = resample(wave, rate, fs)
        if notes is not None:
            notes.append((f"resampled from {rate} Hz to {fs} Hz", path))
    return wave


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int, width: int = 6, rolloff: float = 0.99) -> tuple[torch.Tensor, int]:
    """Hann-windowed sinc band-limited interpolation kernels, as torchaudio's Resample builds them."""
    base = min(orig, new) * rolloff
    half = math.ceil(width * orig / base)
    idx = torch.arange(-half, half + orig, dtype=torch.float64)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + idx
    t = (t * base).clamp(-width, width)
    window = torch.cos(t * math.pi / width / 2) ** 2
    t = t * math.pi
    kernels = torch.where(t == 0, torch.ones_like(t), t.sin() / t) * window * (base / orig)
    return kernels.float(), half


def resample(wave: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    g = math.gcd(orig, new)
    o, n = orig // g, new // g
    kernels, half = _sinc_kernel(o, n)
    x = F.pad(wave[None, None], (half, half + o))
    y = F.conv1d(x, kernels, stride=o)  # [1, n, frames]
    y = y.transpose(1, 2).reshape(-1)
    return y[: math.ceil(n * wave.numel() / o)]
