"""Fun-ASR-Nano's datasets: FunASR jsonl utterances -> fbank + LFR features and FunASR's prompt tokens
(``SpeechDataset``), or random content of a length profile's shapes (``SyntheticDataset``)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch

from ...data.audio import AudioError, read_audio
from ...data.check import LENGTH_SLACK, LENGTH_TOLERANCE, check_declared_text_length
from ...data.dataset import Sample, sample_generator
from ...data.jsonl import DataError, Utterance
from ...data.prompt import PromptBuilder, Tokens
from ...formats.funasr import audio_token_count
from .config import FrontendConfig
from .features import Frontend


def fbank_frames(samples: int, fe: FrontendConfig) -> int:
    """Kaldi fbank frames of ``samples`` at fe.fs (snip_edges): what speech_length counts."""
    win = int(fe.fs * fe.frame_length / 1000)
    hop = int(fe.fs * fe.frame_shift / 1000)
    return 0 if samples < win else 1 + (samples - win) // hop


def check_declared_length(utt: Utterance, path: str, samples: int, fe: FrontendConfig) -> None:
    real = fbank_frames(samples, fe)
    declared = utt.speech_length
    if abs(declared - real) > max(LENGTH_SLACK, LENGTH_TOLERANCE * real):
        raise DataError(f"{utt.source}: speech_length={declared} but audio file {path} is {real} frames "
                        f"({samples / fe.fs:.1f} s); allowed: within {LENGTH_TOLERANCE:.0%} or {LENGTH_SLACK} frames; "
                        "fix speech_length (10 ms frames) in the jsonl")


class SpeechDataset(torch.utils.data.Dataset):
    def __init__(self, utterances: Sequence[Utterance], frontend: FrontendConfig, builder: PromptBuilder, *,
                 seed: int, skip_bad: bool, max_speech_length: int):
        self.utts = utterances
        self.frontend = Frontend(frontend)
        self.builder = builder
        self.seed, self.skip_bad = seed, skip_bad
        self.max_lfr = math.ceil(max_speech_length / frontend.lfr_n)

    def __len__(self) -> int:
        return len(self.utts)

    def lengths(self):
        if hasattr(self.utts, "lengths"):  # an indexed list (speech_index.py): the lengths without parsing a line
            return self.utts.lengths()
        return [u.source_len for u in self.utts]

    def __getitem__(self, item: tuple[int, int] | int) -> Sample:
        index, epoch = item if isinstance(item, tuple) else (item, 0)
        utt = self.utts[index]
        try:
            return self._load(utt, sample_generator(self.seed, epoch, index))
        except (AudioError, DataError) as e:
            message = f"{utt.source}: {e}" if not str(e).startswith(utt.source) else str(e)
            if not self.skip_bad:
                raise DataError(message, "samples") from None
            return Sample(utt.key, error=message)

    def _load(self, utt: Utterance, gen: torch.Generator) -> Sample:
        feats, notes = [], []
        paths = utt.audio_paths()
        for path in paths:
            wave = read_audio(path, self.frontend.cfg.fs, notes)
            if len(paths) == 1:
                check_declared_length(utt, path, wave.numel(), self.frontend.cfg)
            f = self.frontend(wave, gen)
            if f.shape[0] == 0:
                raise AudioError(f"audio file {path} is shorter than one frame ({wave.numel()} samples)")
            if f.shape[0] > self.max_lfr:
                raise DataError(f"audio file {path} gives {f.shape[0]} LFR frames, over the cap from data.max_speech_length")
            feats.append(f)
        # Drawn after the features, so the dither is the same with or without a context header.
        rng = random.Random(int(torch.randint(2**62, (), generator=gen)))
        tokens = self.builder.build(utt, [f.shape[0] for f in feats], rng)
        check_declared_text_length(utt, tokens.labels)
        return Sample(utt.key, feats[: len(tokens.audio_slots)], tokens, notes=notes)


class SyntheticDataset(torch.utils.data.Dataset):
    """Batches with the shapes of real data and random content, from a length profile.

    Each row of the profile gives speech_length (10 ms frames) and text_length (tokens); a sample gets
    random LFR features of the matching length and a prompt of FunASR's token layout (about 17 system +
    user tokens, the audio slots, 5 tokens to open the answer, the text and <|im_end|>). For benchmarks
    and GPU runs that need no audio files or tokenizer.
    """

    PREFIX, SUFFIX = 17, 5

    def __init__(self, rows: list[tuple[int, int]], feat_dim: int, vocab_size: int, lfr_n: int = 6, seed: int = 0,
                 use_low_frame_rate: bool = True):
        self.rows, self.feat_dim, self.vocab, self.lfr_n, self.seed = rows, feat_dim, vocab_size, lfr_n, seed
        self.low_frame_rate = use_low_frame_rate

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> list[int]:
        return [s + t for s, t in self.rows]

    def __getitem__(self, item: tuple[int, int] | int) -> Sample:
        index, _ = item if isinstance(item, tuple) else (item, 0)
        speech_length, text_length = self.rows[index]
        g = sample_generator(self.seed, 0, index)
        frames = max(1, math.ceil(speech_length / self.lfr_n))
        feats = torch.randn(frames, self.feat_dim, generator=g)
        n_audio = audio_token_count(frames, self.low_frame_rate)
        rand = lambda n: torch.randint(1, self.vocab, (n,), generator=g).tolist()  # noqa: E731
        prompt = rand(self.PREFIX) + [0] * n_audio + rand(self.SUFFIX)
        target = rand(text_length + 1)
        tokens = Tokens(prompt + target, [-100] * len(prompt) + target, [(self.PREFIX, n_audio)], ["<synthetic>"])
        return Sample(f"synthetic_{index}", [feats], tokens)


def read_profile(path: str) -> list[tuple[int, int]]:
    """A length profile: jsonl rows with speech_length and text_length (a FunASR jsonl works too)."""
    import json

    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                rows.append((int(obj["speech_length"]), int(obj["text_length"])))
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{path}:{n}: a profile row needs speech_length and text_length ({e})") from None
    if not rows:
        raise DataError(f"{path}: empty length profile")
    return rows
