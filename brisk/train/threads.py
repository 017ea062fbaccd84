"""How many threads torch computes with on the host: on the CPU device against the DataLoader's workers and the
cores, on a GPU for the host that feeds it.

torch's default is one intra-op thread a core. Its OpenMP threads meet at a barrier after every parallel op,
so when another process (or this run's own DataLoader workers) takes one core, every op waits for the
thread that lost its core: on a 2-core machine with one other busy process, the demo's steps were 20 times
slower. ``train.cpu_threads=0`` leaves a core to each worker (the usable cores less data.num_workers, at
least 1): fewer threads, but none of them waits on a stolen core.

On a GPU the host only feeds the device. Decoding batch 64 on an H200's 16-vCPU VM ran at 74 utterances/s with
torch's 16 threads and 160 with one (decoding takes one by itself, brisk.eval.testset.host_threads),
and Qwen3.5 2B's host-bound training step had a ~5% faster median step with one (+4.9% in the
clean one of two interleaved pairs; the other's 16-thread process was a slow first one, +13%); the dense,
device-bound Qwen3 1.7B was the same with either. So auto (0) on a GPU is one thread, N sets N, and -1 sets
torch's default: the count this process started with, so runs (and bench arms) in one process never inherit
each other's. DataLoader workers are separate processes with their own single thread either way.
``brisk.train.run.train`` puts the process's count back when the steps end.
"""

from __future__ import annotations

import logging

import torch

from ..config import Config
from ..diagnose.slow import usable_cores

log = logging.getLogger("brisk")
TORCH_DEFAULT = torch.get_num_threads()  # the process's count before any run set one (OMP_NUM_THREADS, or a core each)


def pick_threads(cfg: Config, device: torch.device, cores: int | None = None) -> str | None:
    """Set torch's intra-op threads for the run (train.cpu_threads) and log what was done; returns that note
    (None: torch's default kept on a GPU, nothing to say)."""
    note = _pick(cfg, device, cores)
    if note:
        log.info(note)
    return note


def _pick(cfg: Config, device: torch.device, cores: int | None) -> str | None:
    want, workers = cfg.train.cpu_threads, cfg.data.num_workers
    cores = cores or usable_cores()
    if device.type != "cpu" and want >= 0:
        torch.set_num_threads(want or 1)
        why = "train.cpu_threads" if want else "auto"
        return f"threads: {want or 1} intra-op thread(s) ({why}, on {device.type}: the host feeds the device)"
    if device.type != "cpu" or want == -1:
        torch.set_num_threads(TORCH_DEFAULT)
        return None if device.type != "cpu" else (
            f"threads: torch's default, {TORCH_DEFAULT} intra-op threads on {cores} usable cores with "
            f"{workers} DataLoader worker(s)" + (" (train.cpu_threads=0 leaves the workers their cores)"
                                                 if workers and TORCH_DEFAULT + workers > cores else ""))
    n = want or max(1, cores - workers)
    torch.set_num_threads(n)
    why = "train.cpu_threads" if want else f"auto: {cores} usable cores less {workers} DataLoader worker(s)"
    return f"threads: {n} intra-op thread(s) ({why})"
