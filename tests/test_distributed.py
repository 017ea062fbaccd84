"""Several processes: device choice under torchrun, rank-synced static shapes, 2 ranks == 1 rank (gloo, CPU)."""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError
from brisk.train.run import pick_device


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def _env(monkeypatch, world: int, local: int) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_RANK", str(local))


@pytest.mark.parametrize("name", ["cuda", "auto", "cuda:1"])
def test_cuda_under_torchrun_is_this_ranks_gpu(monkeypatch, two_gpus, name):
    _env(monkeypatch, 2, 1)
    assert pick_device(name) == torch.device("cuda", 1)


def test_single_process_keeps_the_named_device(monkeypatch, two_gpus):
    _env(monkeypatch, 1, 0)
    assert pick_device("cuda") == torch.device("cuda")
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert pick_device("auto") == torch.device("cuda")
    assert pick_device("cpu") == torch.device("cpu")


def test_device_errors_name_the_key(monkeypatch, two_gpus):
    _env(monkeypatch, 2, 1)
    with pytest.raises(ConfigError, match="LOCAL_RANK=1 owns cuda:1"):
        pick_device("cuda:0")
    _env(monkeypatch, 1, 0)
    with pytest.raises(ConfigError, match="only 2 CUDA device"):
        pick_device("cuda:5")
    with pytest.raises(ConfigError, match="train.device='gpu'"):
        pick_device("gpu")


def test_no_cuda_under_torchrun(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _env(monkeypatch, 2, 0)
    assert pick_device("auto") == torch.device("cpu")  # gloo ranks on the CPU
    with pytest.raises(ConfigError, match="no CUDA device"):
        pick_device("cuda")
