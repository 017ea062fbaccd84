"""Token-bucketed batch sampler (FunASR's CustomDistributedBufferDynamicBatchSampler, made resumable).

Per epoch: a seeded shuffle; chunks of ``sort_size`` utterances sorted by length; batches filled greedily
while (longest length in the batch) x (utterances) stays within ``batch_tokens`` and the batch has at most
``max_utts`` utterances; batches dealt round-robin to ranks (padded with repeats so every rank gets as
many). The position inside the epoch is part of ``state_dict`` so a resumed run sees the same batches.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch


class TokenBatchSampler(torch.utils.data.Sampler):
    def __init__(self, lengths, *, batch_tokens: int, max_utts: int, sort_size: int, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1):
        self.lengths = np.asarray(lengths, dtype=np.int64)  # a list, or an index's array (millions of lines)
        self.batch_tokens, self.max_utts, self.sort_size = batch_tokens, max_utts, sort_size
        self.shuffle, self.seed = shuffle, seed
        self.rank, self.world = rank, world_size
        self.epoch = 0
        self.start = 0  # batches of the epoch to skip once (a resumed run); the trainer counts what it used
        self._memo: tuple[int, list[list[int]]] | None = None  # (epoch, this rank's batches): len() and iter() share it

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``; linear in the number of utterances (a sort of sort_size chunks)."""
        if self._memo is not None and self._memo[0] == epoch:
            return self._memo[1]
        n = len(self.lengths)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + epoch)
            order = torch.randperm(n, generator=g).numpy()
        else:
            order = np.arange(n)
        batches: list[list[int]] = []
        span = self.sort_size * self.world
        for start in range(0, n, span):
            chunk = order[start:start + span]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]  # stable, as sorted() is
            batch: list[int] = []
            longest = 0
            for i, ln in zip(chunk.tolist(), self.lengths[chunk].tolist()):
                if batch and (max(longest, ln) * (len(batch) + 1) > self.batch_tokens or len(batch) >= self.max_utts):
                    batches.append(batch)
                    batch, longest = [], 0
                batch.append(i)
                longest = max(longest, ln)
            if batch:
                batches.append(batch)
        per_rank = math.ceil(len(batches) / self.world)
        rng = random.Random(self.seed + epoch)
        batches += rng.choices(batches, k=per_rank * self.world - len(batches))
        mine = batches[self.rank::self.world]
        self._memo = (epoch, mine)
        return mine

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self):
        # Data-loader workers prefetch ahead of training, so the sampler cannot know how many batches were
        # trained on: the trainer records that, and a resume passes it back as ``start``.
        epoch, start = self.epoch, self.start
        self.start = 0
        for batch in self.batches(epoch)[start:]:
            yield [(i, epoch) for i in batch]

    def __len__(self) -> int:
        return len(self.batches(self.epoch)) - self.start
