"""Datasets, samplers and DataLoaders for a run, from the config."""

from __future__ import annotations

import logging
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import Config, ConfigError
from ..families import family_of
from .collate import Collator
from .context import ContextPrompt
from .dataset import SpeechDataset, SyntheticDataset, read_profile
from .prompt import PromptBuilder
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


def chat_prepare(cfg: Config, which: str, path: str, tokenizer=None):
    """A causal LM's data (jsonl, parquet, datasets folders), tokenised once into the cache (its ``prepare``)."""
    from .chat_store import build_chat_store

    d = cfg.data
    return build_chat_store(path, tokenizer if tokenizer is not None else load_tokenizer(cfg),
                            max_len=d.max_len, overlong=d.overlong, skip_bad=d.skip_bad,
                            cache_dir=cache_dir(cfg), split=d.train_split if which == "train" else d.valid_split,
                            template_path=d.chat_template, workers=d.prepare_workers, what=f"data.{which}")


def speech_prepare(cfg: Config, which: str, path: str, tokenizer=None):
    """A FunASR jsonl indexed once, every line and audio file checked (Fun-ASR-Nano's ``prepare``)."""
    from .speech_index import build_speech_index

    d = cfg.data
    return build_speech_index(path, max_speech_length=d.max_speech_length, max_text_length=d.max_text_length,
                              skip_bad=d.skip_bad, cache_dir=cache_dir(cfg), check_audio=d.check_audio,
                              workers=d.prepare_workers, what=f"data.{which}")


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
    sampler = TokenBatchSampler(dataset.lengths(), batch_tokens=d.batch_tokens, max_utts=d.max_utts,
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


def chat_dataset(cfg: Config, which: str, path: str | None, vocab_size: int, tokenizer=None, prepared=None):
    """A causal LM's split: chat data with assistant-only labels (the family's ``dataset``)."""
    if not path:
        if which == "train":
            raise ConfigError("data.train: give chat data: a jsonl, parquet files (a file, folder or glob) or a "
                              "datasets save_to_disk folder, with 'messages' or 'prompt' + 'completion'")
        return None
    dataset = prepared if prepared is not None else chat_prepare(cfg, which, path, tokenizer)
    return dataset, dataset.bad_first, dict(dataset.counts)


def speech_dataset(cfg: Config, which: str, path: str | None, vocab_size: int, tokenizer=None, prepared=None):
    """Fun-ASR-Nano's split: FunASR jsonl (FunASR's prompt and labels, fbank + LFR), or synthetic batches of a
    length profile (the family's ``dataset``)."""
    d = cfg.data
    skipped: list[str] = []
    counts: dict[str, int] = {}
    if path:
        index = prepared if prepared is not None else speech_prepare(cfg, which, path, tokenizer)
        skipped = index.skipped
        counts = {"bad_lines": len(skipped), "suspect_lines": index.meta["suspects"],
                  "missing_audio": index.meta["audio_missing"]}
        builder = PromptBuilder(tokenizer if tokenizer is not None else load_tokenizer(cfg), sys_prompt=d.sys_prompt,
                                do_think=d.do_think, multiturn_max=d.multiturn_max, max_token_length=d.max_token_length,
                                use_low_frame_rate=cfg.model.adaptor.use_low_frame_rate,
                                context=ContextPrompt(d.prompt_class, d.prompt_conf) if d.prompt_class else None)
        dataset = SpeechDataset(index.utterances, cfg.model.frontend, builder, seed=cfg.train.seed,
                                skip_bad=d.skip_bad, max_speech_length=d.max_speech_length)
    elif which == "train" and d.profile:
        fe = cfg.model.frontend
        dataset = SyntheticDataset(read_profile(d.profile), fe.n_mels * fe.lfr_m, vocab_size, fe.lfr_n,
                                   seed=cfg.train.seed, use_low_frame_rate=cfg.model.adaptor.use_low_frame_rate)
    else:
        if which == "train":
            raise ConfigError("data.train: give a FunASR jsonl (or data.profile for synthetic batches)")
        return None
    return dataset, skipped, counts


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
