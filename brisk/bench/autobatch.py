"""data.auto_batch: the largest batch that fits the GPU, found by trial steps (NeMo's OOMptimizer idea).

Bigger decoders leave most of the GPU idle at FunASR's 6000-frame budget; the right budget depends on the
model, the switches (activation checkpointing, LoRA, graphs) and the GPU, and is cheaper to measure than to
predict. A throw-away copy of the training step (model, optimizer, speed plan) is built once; for each candidate
``data.batch_tokens`` (``data.max_utts`` scaled with it) it runs the candidate's heaviest batch (most LLM
tokens, so the largest pack bucket it reaches) twice, the second time with the optimizer's state resident,
and ``torch.cuda.max_memory_allocated`` is its peak. With speed.cuda_graph every bucket's graph is captured
when the step is built, so the peak then covers all buckets whatever the candidate: the search says whether
the configured buckets fit, and the budget only changes how full batches are. A binary search over the sorted candidates (peak memory
grows with the budget) keeps the largest one whose peak is within ``memory_frac`` of the GPU; an
out-of-memory error counts as too large. The answer is cached in a small json file under a key made of the
model config, the GPU, torch's version and the switches, so the trials run once per combination.

The search and the cache take the peak-memory function as an argument: the CPU tests give them a
made-up one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..config import Config

log = logging.getLogger("brisk")

OOM = float("inf")  # the recorded peak of a trial that ran out of memory


@dataclass
class Search:
    best: int | None  # the largest candidate that fits; None: not even the smallest
    peaks: dict[int, float] = field(default_factory=dict)  # bytes per tried candidate (inf: out of memory)


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def largest_fitting(peak_of: Callable[[int], float], candidates: Sequence[int], limit: float) -> Search:
    """Binary search of sorted ``candidates`` for the largest whose ``peak_of`` is at most ``limit`` bytes.
    Assumes the peak grows with the candidate; each candidate is tried at most once."""
    out = Search(None)
    lo, hi = 0, len(candidates) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        c = candidates[mid]
        try:
            peak = float(peak_of(c))
        except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
            if not _is_oom(e):
                raise
            peak = OOM
        out.peaks[c] = peak
        if peak <= limit:
            out.best, lo = c, mid + 1
        else:
            hi = mid - 1
    return out


def scaled(cfg: Config, batch_tokens: int) -> Config:
    """``cfg`` with data.batch_tokens set and data.max_utts scaled by the same factor (same utterance density)."""
    d = cfg.data
    utts = max(1, math.ceil(d.max_utts * batch_tokens / d.batch_tokens))
    return dataclasses.replace(cfg, data=dataclasses.replace(d, batch_tokens=batch_tokens, max_utts=utts))


def cache_key(cfg: Config, device_name: str, device_bytes: int) -> str:
    """What the answer depends on: the model (sizes, dtype, LoRA, activation checkpointing), the data lengths
    (file and utterance density), the speed switches, the target, the GPU and torch."""
    d, a = cfg.data, cfg.data.auto_batch
    parts = {"model": dataclasses.asdict(cfg.model), "speed": dataclasses.asdict(cfg.speed),
             "data": {"train": d.train, "profile": d.profile, "batch_tokens": d.batch_tokens, "max_utts": d.max_utts,
                      "max_token_length": d.max_token_length},
             "target": {"memory_frac": a.memory_frac, "candidates": a.candidates, "trial_batches": a.trial_batches},
             "accum_grad": cfg.train.accum_grad, "gpu": [device_name, device_bytes], "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


class BudgetCache:
    """{key: {"batch_tokens", "peaks", "gpu"}} in one json file; a damaged file is treated as empty."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "brisk" / "autobatch.json"

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> dict | None:
        return self.read().get(key)

    def put(self, key: str, value: dict) -> None:
        entries = {**self.read(), key: value}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)  # two runs writing at once: the last whole file wins, never a torn one


def find_batch_tokens(cfg: Config, peak_of: Callable[[int], float], device_name: str, device_bytes: int) -> tuple[dict, bool]:
    """(the cached or newly measured entry, whether it came from the cache)."""
    a = cfg.data.auto_batch
    cache = BudgetCache(a.cache)
    key = cache_key(cfg, device_name, device_bytes)
    hit = cache.get(key)
    if hit is not None:
        return hit, True
    search = largest_fitting(peak_of, a.candidates, a.memory_frac * device_bytes)
    entry = {"batch_tokens": search.best, "peaks_gib": {str(c): (None if p == OOM else round(p / 2**30, 3))
                                                       for c, p in sorted(search.peaks.items())},
             "gpu": device_name, "limit_gib": round(a.memory_frac * device_bytes / 2**30, 3)}
    rows = getattr(peak_of, "rows", None)
    if rows:  # which pack bucket each tried budget's heaviest batch reached
        entry["row_tokens"] = {str(c): rows[c] for c in sorted(rows)}
    cache.put(key, entry)
    return entry, False


def runner_peak(runner, cfg: Config) -> Callable[[int], float]:
    """Peak allocated CUDA memory of a candidate budget's heaviest batch (most LLM tokens) on ``runner``, run
    twice (the second with AdamW's state allocated). The runner's weights change: it is a throw-away one.
    ``peak_of.rows`` records the packed row length (the pack bucket) each candidate's trial ran at."""
    from .harness import llm_vocab, sample_stream

    def peak_of(batch_tokens: int) -> float:
        trial = scaled(cfg, batch_tokens)
        samples = sample_stream(trial, trial.data.auto_batch.trial_batches, llm_vocab(trial))
        heaviest = max(samples, key=lambda s: sum(len(x.tokens.input_ids) for x in s))
        batch = runner.collate(heaviest)
        peak_of.rows[batch_tokens] = int(batch.input_ids.shape[-1])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        try:
            for _ in range(2):
                runner.run(batch)
            torch.cuda.synchronize()
        except RuntimeError as e:
            if _is_oom(e):  # what the failed step held is freed before the next, smaller trial
                runner.model.zero_grad(set_to_none=True)
                gc.collect()
                torch.cuda.empty_cache()
            raise
        return float(torch.cuda.max_memory_allocated())

    peak_of.rows = {}
    return peak_of


@contextlib.contextmanager
def trial_runner(cfg: Config):
    """A throw-away training step (model, optimizer, speed plan) for the trials, built for the largest
    candidate's utterance count, freed afterwards. Yields (runner, peak_of)."""
    from .harness import build_runner

    threads = torch.get_num_threads()  # the trial sets train.cpu_threads; the run that follows reads the process's
    runner = build_runner(scaled(cfg, cfg.data.auto_batch.candidates[-1]))
    try:
        yield runner, runner_peak(runner, cfg)
    finally:
        del runner
        gc.collect()
        torch.cuda.empty_cache()
        torch.set_num_threads(threads)


def _measured(cfg: Config, name: str, total: int) -> tuple[dict, bool]:
    with trial_runner(cfg) as (_, peak_of):
        return find_batch_tokens(cfg, peak_of, name, total)


def _never(batch_tokens: int) -> float:
    raise AssertionError("a cached budget needs no trial step")


def sized_to_gpu(cfg: Config) -> Config:
    """data.auto_batch: ``cfg`` with the largest fitting data.batch_tokens (and max_utts scaled), else ``cfg``."""
    a = cfg.data.auto_batch
    if not a.enabled:
        return cfg
    if not torch.cuda.is_available():
        log.warning("data.auto_batch: no CUDA device; data.batch_tokens stays %d", cfg.data.batch_tokens)
        return cfg
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # ranks measuring apart could pick different batches
        log.warning("data.auto_batch: not with several ranks yet (run it once on one GPU: the answer is cached); "
                    "data.batch_tokens stays %d", cfg.data.batch_tokens)
        return cfg
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    key = cache_key(cfg, props.name, props.total_memory)
    if BudgetCache(a.cache).get(key) is not None:
        entry, cached = find_batch_tokens(cfg, _never, props.name, props.total_memory)
    else:
        entry, cached = _measured(cfg, props.name, props.total_memory)
        gc.collect()  # the trial step's model and optimizer are unreachable once _measured has returned
        torch.cuda.empty_cache()
    best = entry["batch_tokens"]
    if best is None:
        log.warning("data.auto_batch: even data.batch_tokens=%d peaks over %.0f%% of the GPU (%s); keeping %d",
                    a.candidates[0], 100 * a.memory_frac, entry["peaks_gib"], cfg.data.batch_tokens)
        return cfg
    out = scaled(cfg, best)
    log.info("data.auto_batch: data.batch_tokens=%d, data.max_utts=%d (peak GiB per tried budget %s, limit %.1f GiB; %s)",
             best, out.data.max_utts, entry["peaks_gib"], entry["limit_gib"], "cached" if cached else "measured")
    return keep_schedule(cfg, out)


def keep_schedule(cfg: Config, out: Config) -> Config:
    """The configured batch is the one the schedule was chosen for: unless optim.warmup_step_tokens says otherwise
    it becomes that, so the warm-up is scaled to the same tokens at the found batch (brisk.train.optim.schedule_for;
    the peak lr too with optim.lr_scale=sqrt)."""
    if cfg.optim.warmup_step_tokens or out.data.batch_tokens == cfg.data.batch_tokens:
        return out
    tokens = cfg.data.batch_tokens * cfg.train.accum_grad
    log.info("data.auto_batch: optim.warmup_step_tokens=%d (the configured batch): the warm-up keeps its tokens", tokens)
    return dataclasses.replace(out, optim=dataclasses.replace(out.optim, warmup_step_tokens=tokens))
