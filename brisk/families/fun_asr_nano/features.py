"""Audio front end: Kaldi fbank (80 mels, 25/10 ms, hamming) and low-frame-rate stacking (m=7, n=6).

Numerically FunASR's WavFrontend: samples scaled to the int16 range, Kaldi's fbank recipe (dither, DC
removal, pre-emphasis 0.97, povey-style framing with snip_edges, power spectrum of a 512-point FFT, HTK
mel banks from 20 Hz to Nyquist, log with a float eps floor), then LFR stacking that pads the front with
(m-1)//2 copies of the first frame and the back with copies of the last, and optional CMVN.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .config import FrontendConfig

_EPS = torch.finfo(torch.float32).eps


def _mel(f):
    return 1127.0 * torch.log(1.0 + f / 700.0)


def mel_banks(num_bins: int, fft_size: int, fs: float, low: float = 20.0, high: float = 0.0) -> torch.Tensor:
    """Triangular HTK-mel filters [num_bins, fft_size // 2 + 1] (Kaldi's MelBanks, no VTLN)."""
    if high <= 0.0:
        high += fs / 2
    mel_low, mel_high = _mel(torch.tensor(low)), _mel(torch.tensor(high))
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = torch.arange(num_bins, dtype=torch.float32)[:, None]
    left, center, right = mel_low + b * delta, mel_low + (b + 1) * delta, mel_low + (b + 2) * delta
    mel = _mel(fs / fft_size * torch.arange(fft_size // 2, dtype=torch.float32))[None, :]
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)
    return F.pad(banks, (0, 1))  # the Nyquist bin gets no weight, as in Kaldi


def _window(kind: str, n: int) -> torch.Tensor:
    if kind == "hamming":
        return torch.hamming_window(n, periodic=False, alpha=0.54, beta=0.46)
    if kind == "hanning":
        return torch.hann_window(n, periodic=False)
    if kind == "povey":
        return torch.hann_window(n, periodic=False).pow(0.85)
    if kind == "rectangular":
        return torch.ones(n)
    if kind == "blackman":
        a = 2 * math.pi / (n - 1)
        t = torch.arange(n, dtype=torch.float32)
        return 0.42 - 0.5 * torch.cos(a * t) + 0.08 * torch.cos(2 * a * t)
    raise ValueError(f"unknown window {kind!r}")


def fbank(wave: torch.Tensor, cfg: FrontendConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """wave: [S] float in [-1, 1] at cfg.fs -> log-mel frames [T, n_mels] (T = 0 for audio under one frame)."""
    wave = wave.float()
    if cfg.upscale_samples:
        wave = wave * 32768.0
    duration_ms = wave.numel() / cfg.fs * 1000
    frame_ms = min(cfg.frame_length, duration_ms)  # FunASR shortens the window for clips under 25 ms
    size = int(cfg.fs * frame_ms * 0.001)
    shift = int(cfg.fs * cfg.frame_shift * 0.001)
    if size < 1 or wave.numel() < size:
        return torch.zeros(0, cfg.n_mels)
    n_frames = 1 + (wave.numel() - size) // shift
    frames = wave.as_strided((n_frames, size), (shift, 1)).clone()  # [T, size]
    if cfg.dither != 0.0:
        frames += cfg.dither * torch.randn(frames.shape, generator=generator)
    frames -= frames.mean(dim=1, keepdim=True)
    prev = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = (frames - 0.97 * prev) * _window(cfg.window, size)[None, :]
    fft_size = 1 << (size - 1).bit_length()
    frames = F.pad(frames, (0, fft_size - size))
    power = torch.fft.rfft(frames).abs().pow(2.0)
    mel = power @ mel_banks(cfg.n_mels, fft_size, cfg.fs).T
    return torch.clamp(mel, min=_EPS).log()


def lfr(feats: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """Stack m frames every n: [T, D] -> [ceil(T/n), m*D], edge frames replicated."""
    if m == 1 and n == 1:
        return feats
    t, d = feats.shape
    t_lfr = math.ceil(t / n)
    left = feats[:1].expand((m - 1) // 2, d)
    need = (t_lfr - 1) * n + m  # rows the last window reaches
    have = t + (m - 1) // 2
    right = feats[-1:].expand(max(need - have, 0), d)
    padded = torch.cat([left, feats, right])
    return padded.unfold(0, m, n)[:t_lfr].transpose(1, 2).reshape(t_lfr, m * d).contiguous()


def load_cmvn(path: str | Path) -> torch.Tensor:
    """Kaldi nnet-format am.mvn (<AddShift> means, <Rescale> scales) -> [2, D]."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    shift = scale = None
    for i, line in enumerate(lines):
        head = line.split()
        if not head:
            continue
        if head[0] in ("<AddShift>", "<Rescale>") and i + 1 < len(lines):
            nxt = lines[i + 1].split()
            if nxt and nxt[0] == "<LearnRateCoef>":
                values = np.array(nxt[3:-1], dtype=np.float32)
                if head[0] == "<AddShift>":
                    shift = values
                else:
                    scale = values
    if shift is None or scale is None:
        raise ValueError(f"{path}: no <AddShift>/<Rescale> blocks; not a Kaldi am.mvn file")
    return torch.from_numpy(np.stack([shift, scale]))


def batch_fbank(waves: torch.Tensor, lengths: torch.Tensor, cfg: FrontendConfig, window: torch.Tensor,
                banks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fbank`` of a batch at once, on the batch's device: waves [B, S] (zero padded), lengths [B] (samples,
    each at least one full window) -> log-mel frames [B, T, n_mels] and frame counts [B]. Frames past an
    utterance's count are computed on padding and must be ignored (``batch_lfr`` does). No dither."""
    size = window.numel()
    shift = int(cfg.fs * cfg.frame_shift * 0.001)
    waves = waves.float() * (32768.0 if cfg.upscale_samples else 1.0)
    counts = 1 + torch.div(lengths - size, shift, rounding_mode="floor")  # [B]
    frames = waves.unfold(1, size, shift)  # [B, T, size]: views of the padded waves
    frames = frames - frames.mean(dim=2, keepdim=True)
    prev = torch.cat([frames[..., :1], frames[..., :-1]], dim=2)
    frames = (frames - 0.97 * prev) * window
    fft_size = banks.shape[1] * 2 - 2
    power = torch.fft.rfft(F.pad(frames, (0, fft_size - size))).abs().pow(2.0)  # [B, T, fft_size / 2 + 1]
    mel = power @ banks.T  # [B, T, n_mels]
    return torch.clamp(mel, min=_EPS).log(), counts


def batch_lfr(feats: torch.Tensor, counts: torch.Tensor, m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``lfr`` of a batch: [B, T, D] with ``counts`` valid frames each -> [B, T', m*D] (zero past each
    utterance's ceil(count / n) rows) and those row counts. Output row j of an utterance stacks its frames
    j*n - (m-1)//2 + k (k < m), each index clamped into [0, count - 1]: the replicated edges of ``lfr``."""
    b, t, d = feats.shape
    out_counts = torch.div(counts + n - 1, n, rounding_mode="floor")  # ceil(count / n)
    rows = -(-t // n)
    j = torch.arange(rows, device=feats.device)
    k = torch.arange(m, device=feats.device)
    idx = (j[:, None] * n - (m - 1) // 2 + k[None, :])[None]  # [1, T', m]
    idx = torch.minimum(idx.clamp(min=0), (counts - 1).clamp(min=0)[:, None, None])  # [B, T', m]
    stacked = torch.gather(feats, 1, idx.reshape(b, -1, 1).expand(b, rows * m, d)).reshape(b, rows, m * d)
    valid = j[None, :] < out_counts[:, None]  # [B, T']
    return stacked * valid[..., None], out_counts


class Frontend:
    """waveform -> LFR features [T_lfr, n_mels * lfr_m] (float32, CPU; run in data workers). ``batch`` computes
    the same features for many waveforms at once on any device (validation, eval, transcribe)."""

    def __init__(self, cfg: FrontendConfig):
        self.cfg = cfg
        self.cmvn = load_cmvn(cfg.cmvn_file) if cfg.cmvn_file else None
        self._consts: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}

    def batch(self, waves: list[torch.Tensor], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Waveforms [S_i] (any device) -> LFR features [B, T', D] on ``device``, zero past each utterance's
        length, and the lengths [B]. Without dither; equal to ``__call__`` up to float rounding (the FFT and the
        mel projection sum in another order). A clip shorter than one window (FunASR shortens the window for
        those) goes through ``__call__`` alone."""
        c = self.cfg
        device = torch.device(device)
        size = int(c.fs * c.frame_length * 0.001)
        if device not in self._consts:
            fft_size = 1 << (size - 1).bit_length()
            cmvn = self.cmvn.to(device) if self.cmvn is not None else None
            self._consts[device] = (_window(c.window, size).to(device), mel_banks(c.n_mels, fft_size, c.fs).to(device), cmvn)
        window, banks, cmvn = self._consts[device]
        short = [i for i, w in enumerate(waves) if w.numel() < size]
        long = [i for i in range(len(waves)) if i not in short]
        parts: dict[int, torch.Tensor] = {}
        n_rows: list[int] = []
        if long:
            lengths = torch.tensor([waves[i].numel() for i in long])
            padded = torch.zeros(len(long), int(lengths.max()))
            for row, i in enumerate(long):  # one host copy of the batch, then one transfer
                padded[row, : waves[i].numel()] = waves[i].float().cpu()
            padded = padded.pin_memory() if device.type == "cuda" else padded
            padded = padded.to(device, non_blocking=True)
            lengths = lengths.to(device)
            mel, counts = batch_fbank(padded, lengths, c, window, banks)
            feats, counts = batch_lfr(mel, counts, c.lfr_m, c.lfr_n)
            if cmvn is not None:
                d = feats.shape[2]
                feats = (feats + cmvn[0, :d]) * cmvn[1, :d] * (torch.arange(feats.shape[1], device=device)[None, :]
                                                              < counts[:, None])[..., None]
            if not short:
                return feats, counts
            for row, i in enumerate(long):
                parts[i] = feats[row]
            n_rows = counts.tolist()
        for i in short:
            parts[i] = self(waves[i].float().cpu()).to(device)
        lens = [(n_rows[long.index(i)] if i in long else parts[i].shape[0]) for i in range(len(waves))]
        t = max(max(lens), 1)
        out = torch.zeros(len(waves), t, self.dim, device=device)
        for i, n in enumerate(lens):
            out[i, :n] = parts[i][:n]
        return out, torch.tensor(lens, device=device)

    @property
    def dim(self) -> int:
        return self.cfg.n_mels * self.cfg.lfr_m

    def __call__(self, wave: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        feats = lfr(fbank(wave, self.cfg, generator), self.cfg.lfr_m, self.cfg.lfr_n)
        if self.cmvn is not None:
            feats = (feats + self.cmvn[0, : feats.shape[1]]) * self.cmvn[1, : feats.shape[1]]
        return feats

    def num_frames(self, num_samples: int) -> int:
        """LFR frames for a clip of num_samples, without computing it."""
        size = int(self.cfg.fs * self.cfg.frame_length * 0.001)
        shift = int(self.cfg.fs * self.cfg.frame_shift * 0.001)
        t = 0 if num_samples < size else 1 + (num_samples - size) // shift
        return math.ceil(t / self.cfg.lfr_n)
