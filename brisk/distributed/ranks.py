"""Which process this is: its device, its rank among the ranks, and the two small collectives the run's
bookkeeping needs (rank 0's answer everywhere; everyone's state on rank 0)."""

from __future__ import annotations

import os

import torch

from ..errors import ConfigError


def pick_device(name: str) -> torch.device:
    """train.device -> the device of this process. Under torchrun (WORLD_SIZE > 1) ``auto`` and ``cuda`` mean
    this rank's GPU, cuda:LOCAL_RANK; an explicit ``cuda:N`` must name that same GPU (each rank owns one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "auto":
        if world > 1:
            name = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"train.device={name!r}: use auto, cpu, cuda or cuda:N") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device={name}: no CUDA device is available")
        if world > 1:
            if dev.index is not None and dev.index != local:
                raise ConfigError(f"train.device={name} under torchrun: rank with LOCAL_RANK={local} owns cuda:{local}; "
                                  "use train.device=cuda (or auto) and let each rank take its own GPU")
            dev = torch.device("cuda", local)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"train.device={name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type != "cpu":
        raise ConfigError(f"train.device={name!r}: use auto, cpu, cuda or cuda:N")
    return dev


def init_distributed(device: torch.device) -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return torch.distributed.get_rank(), world


def gather_to_rank0(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on rank 0 (a collective under torch.distributed); [obj] alone."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    world = torch.distributed.get_world_size()
    out = [None] * world if torch.distributed.get_rank() == 0 else None
    torch.distributed.gather_object(obj, out, dst=0)
    return out


def broadcast_from_rank0(obj):
    """Rank 0's value on every rank (a collective under torch.distributed)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]

