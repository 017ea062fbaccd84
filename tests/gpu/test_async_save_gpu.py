"""CUDA-only: the asynchronous checkpoint's snapshot of GPU tensors (pinned buffers, one sync)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from brisk.models.build import read_checkpoint
from brisk.train.async_save import AsyncCheckpointer, HostSnapshot
from brisk.train.checkpoint import Checkpoints

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_snapshot_of_cuda_tensors_is_pinned_exact_and_independent():
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    step = torch.tensor(3.0, device="cuda")
    snap = HostSnapshot(pin=True)
    a = snap.take({"w": w, "head": w, "opt": {"step": step}})
    assert a["w"].is_pinned() and a["w"] is a["head"] and a["w"].device.type == "cpu"
    assert torch.equal(a["w"], w.cpu()) and float(a["opt"]["step"]) == 3.0
    w.mul_(2)  # the next step changes the weights: the snapshot must not
    assert not torch.equal(a["w"], w.cpu())
    b = snap.take({"w": w, "head": w, "opt": {"step": step}})
    assert b["w"].data_ptr() == a["w"].data_ptr() and torch.equal(b["w"], w.cpu())  # pinned buffer reused


def test_async_checkpoint_of_a_cuda_model_resumes_exactly(tmp_path):
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8)).cuda()
    model[0].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model(torch.randn(4, 64, device="cuda")).sum().backward()
    opt.step()
    saver = AsyncCheckpointer(Checkpoints(tmp_path, 3, "loss"), model, torch.device("cuda"))
    saver.save({"state_dict": model.state_dict(), "optimizer": opt.state_dict()}, 1, None)
    want = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model[1].weight.add_(1)  # training goes on while the write runs
    saver.close()
    got = read_checkpoint(tmp_path / "checkpoints" / "ckpt-00000001.pt")["state_dict"]
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_warm_allocates_pinned_buffers_that_the_first_save_reuses(tmp_path):
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256)).cuda()
    model[0].requires_grad_(False)  # frozen: its file is written by start_frozen, before warm (as a run does)
    saver = AsyncCheckpointer(Checkpoints(tmp_path, 3, "loss"), model, torch.device("cuda"))
    saver.start_frozen()
    saver.warm(lambda: {"state_dict": model.state_dict()})
    saver.wait()
    assert saver.frozen_ref is not None and sorted(saver.frozen_ref["keys"]) == ["0.bias", "0.weight"]
    ptrs = {k: b.data_ptr() for k, b in saver.snapshot.buffers.items()}
    assert ptrs and all(b.is_pinned() for b in saver.snapshot.buffers.values())
    saver.save({"state_dict": model.state_dict()}, 1, None)
    saver.close()
    assert {k: b.data_ptr() for k, b in saver.snapshot.buffers.items()} == ptrs
    got = read_checkpoint(tmp_path / "checkpoints" / "ckpt-00000001.pt")["state_dict"]
    assert all(torch.equal(got[k], v.cpu()) for k, v in model.state_dict().items())
