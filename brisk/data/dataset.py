"""A sample as every family's dataset gives it (features and prompt tokens), and the seed of its randomness.

Indices arrive as (index, epoch) pairs from the batch sampler, so a sample's randomness (FunASR's fbank dither) is
seeded by (seed, epoch, index): identical on every run and after a resume, whichever worker computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .prompt import Tokens


@dataclass
class Sample:
    key: str
    feats: list[torch.Tensor] = field(default_factory=list)  # one [F, D] per audio reference
    tokens: Tokens | None = None
    error: str | None = None  # set (and the rest empty) for a bad sample under skip_bad
    notes: list[tuple[str, str]] = field(default_factory=list)  # conversions done on the audio (resampled, down-mixed)


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + epoch) * 10_000_019 + index)
    return g
