"""Datasets, samplers and DataLoaders for a run, from the config."""

from __future__ import annotations

import logging
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import Config, ConfigError
from ..families import family_of
from .collate import Collator
from .sampler import TokenBatchSampler

log = logging.getLogger("brisk")


def load_tokenizer(cfg: Config):
    from transformers import AutoTokenizer

    path = cfg.data.tokenizer or cfg.model.llm.path
    if not path:
        raise ConfigError("data.tokenizer: give a local tokenizer folder (or model.llm.path that holds one)")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def prepare_data(cfg: Config, tokenizer=None) -> dict[str, object]:
    """data.train and data.valid read, checked and indexed or tokenised by the model family (its ``prepare``),
    before the model is built: a bad line or audio file is one line at start, not after a minute of loading a
    2B model. What is built is cached in data.cache_dir and handed to build_split as it is."""
    if not cfg.data.train and not cfg.data.profile:  # no training data: the family's one line, before the model
        family_of(cfg).dataset(cfg, "train", None, 0)
    prepare = family_of(cfg).prepare
    out: dict[str, object] = {"train": None, "valid": None}
    if prepare is not None:
        for which in out:
            path = cfg.data.train if which == "train" else cfg.data.valid
            if path:
                out[which] = prepare(cfg, which, path, tokenizer)
    return out


@dataclass
class Split:
    dataset: torch.utils.data.Dataset
    sampler: TokenBatchSampler
    loader: torch.utils.data.DataLoader
    skipped_lines: list[str]
    counts: dict[str, int] = field(default_factory=dict)  # what was not trained as written: truncated, skipped, ...

    def close(self) -> None:
        """Stop the persistent workers now. Left to interpreter exit, joining them can hold the process for
        many seconds after its last line (DataLoader's _clean_up_worker), or hang it."""
        loader = getattr(self.loader, "loader", self.loader)  # the DataLoader inside NotedLoader
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        # On the DataLoader itself: its next iter() then starts new workers. Set on the wrapper, the DataLoader kept
        # the shut-down iterator and reused it ("Queue ... is closed" when averaging validated after the run).
        loader._iterator = None


def build_split(cfg: Config, which: str, collator: Collator, vocab_size: int, rank: int = 0, world: int = 1,
                tokenizer=None, prepared=None) -> Split | None:
    """``prepared``: what prepare_data built for this split (built here when not given)."""
    d = cfg.data
    path = d.train if which == "train" else d.valid
    made = family_of(cfg).dataset(cfg, which, path, vocab_size, tokenizer, prepared)  # the model family's samples
    if made is None:
        return None
    dataset, skipped, counts = made
    lengths = dataset.lengths()
    if collator.align:  # each sequence takes its padded span in the row: count that against the batch's tokens
        lengths = -(-np.asarray(lengths, dtype=np.int64) // collator.align) * collator.align  # (millions of lines)
    sampler = TokenBatchSampler(lengths, batch_tokens=d.batch_tokens, max_utts=d.max_utts,
                                sort_size=d.sort_size, shuffle=d.shuffle and which == "train", seed=cfg.train.seed,
                                rank=rank, world_size=world)
    # Our own generator: the loader then draws its worker seeds from it, not from torch's global RNG,
    # so dropout randomness in the model is the same with or without a resume.
    gen = torch.Generator()
    gen.manual_seed(cfg.train.seed)
    workers = d.num_workers
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=collator, num_workers=workers,
        pin_memory=d.pin_memory and torch.cuda.is_available(), generator=gen,
        prefetch_factor=4 if workers else None, persistent_workers=workers > 0,
        worker_init_fn=ignore_sigint if workers else None,
    )
    return Split(dataset, sampler, NotedLoader(loader, which), skipped, counts)


def cache_dir(cfg: Config) -> Path:
    """data.cache_dir, or .brisk-cache beside the run folder: runs under one parent folder share it."""
    if cfg.data.cache_dir:
        return Path(cfg.data.cache_dir).expanduser()
    return Path(cfg.train.output_dir).expanduser().resolve().parent / ".brisk-cache"


def ignore_sigint(_worker_id: int) -> None:
    """Ctrl-C reaches every process of the terminal's group; the training process decides what it means
    (brisk.train.stop: finish the step, save), so a worker must not die of it and fail the loader first."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class NotedLoader:
    """A DataLoader that says once what was done to the audio (resampled, down-mixed), with counts.

    The first file of each kind is logged when its batch arrives; the counts after the first full pass
    (or when the loop leaves early). Everything else is the DataLoader's own.
    """

    def __init__(self, loader: torch.utils.data.DataLoader, name: str):
        self.loader, self.name = loader, name
        self.seen: set[str] = set()
        self.reported = False

    def __iter__(self):
        counts: Counter = Counter()
        try:
            for batch in self.loader:
                for what, path in batch.notes:
                    if what not in self.seen:
                        self.seen.add(what)
                        log.info("%s data: audio %s (first: %s); counts after the first pass", self.name, what, path)
                    counts[what] += 1
                yield batch
        finally:
            if counts and not self.reported:
                self.reported = True
                log.info("%s data, first pass: %s", self.name, ", ".join(f"{n} files {k}" for k, n in sorted(counts.items())))

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)
