"""brisk.files: atomic writes, the background fsync, CRC-less torch.save, and resume past a torn checkpoint."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from brisk import files
from brisk.config import load_config
from brisk.data.collate import collator_for
from brisk.families.fun_asr_nano.data import graph_examples
from brisk.speed.graph import MAX_GRAPH_TOKENS
from brisk.train.checkpoint import Checkpoints

from .conftest import REPO


def _crc_setting() -> bool:
    from torch.utils.serialization import config

    return config.save.compute_crc32


def test_unsynced_write_is_in_place_then_fsynced_in_the_background(tmp_path, monkeypatch):
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name the fsynced files")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    w = torch.randn(1000)
    before = _crc_setting()
    files.atomic_save({"w": w}, tmp_path / "a.pt", sync=False)
    assert _crc_setting() == before  # the CRC switch is scoped to the save
    assert torch.equal(torch.load(tmp_path / "a.pt")["w"], w)  # in place at once, loadable without its CRC
    assert files.SYNCER.wait(timeout=30)
    assert str(tmp_path / "a.pt") in synced and str(tmp_path) in synced
    assert files.SYNCER.pending() == (0, 0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_synced_write_waits_for_the_disk_before_the_rename(tmp_path, monkeypatch):
    order: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append("rename"), real_replace(a, b)))
    files.atomic_save({"w": torch.ones(3)}, tmp_path / "b.pt", sync=True)
    assert order == ["fsync", "rename", "fsync"]  # file, rename, folder


def test_resume_skips_a_torn_newest_checkpoint(tmp_path, caplog):
    ck = Checkpoints(tmp_path, keep_n=3, metric="loss")
    for step in (1, 2):
        ck.save({"state_dict": {"w": torch.full((4096,), float(step))}, "trainer": {"step": step}}, step, None, sync=False)
    newest = ck.dir / "ckpt-00000002.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # what a power loss can leave
    with caplog.at_level(logging.WARNING, logger="brisk"):
        assert ck.latest_intact() == ck.dir / "ckpt-00000001.pt"
    assert "ckpt-00000002.pt is incomplete" in caplog.text
    assert ck.latest() == newest  # the plain listing still names it: only resume checks the file


def test_every_bucket_gets_an_example_batch_of_its_own_length():
    """Graphs are captured up front for every bucket, so none is captured (and compiled) mid-training."""
    cfg = load_config(REPO / "configs" / "fun_asr_nano.yaml", ["speed.packing=true", "speed.cuda_graph=true", "speed.frozen_eval=true"],
                      check_paths=False)
    batches = graph_examples(cfg, collator_for(cfg), 151936, MAX_GRAPH_TOKENS)
    lengths = [b.input_ids.shape[1] for b in batches]
    wanted = [t for t in cfg.speed.pack_buckets if t <= MAX_GRAPH_TOKENS]
    assert lengths[: len(wanted)] == wanted
    assert sorted({b.speech.shape[1] for b in batches}) == sorted(cfg.speed.speech_buckets)


def test_a_file_removed_before_its_fsync_is_no_error(tmp_path):
    """Keep-n pruning can delete a checkpoint the syncer has not reached yet: nothing to make durable."""
    files.SYNCER.wait(timeout=30)
    before = list(files.SYNCER.errors)
    p = tmp_path / "gone.pt"
    p.write_bytes(b"x")
    files.SYNCER._pending[p] = 1  # as submit() records it, without starting the work before the removal
    p.unlink()
    files.SYNCER.submit([])  # wakes the thread
    files.SYNCER._queue.put([p])
    assert files.SYNCER.wait(timeout=30)
    assert files.SYNCER.errors == before


@pytest.mark.parametrize("sync", [True, False])
def test_atomic_writes_get_the_modes_of_a_plain_write(tmp_path, sync):
    """Checkpoints, eval jsonl and transcribe --out go through a temp file (mkstemp: 0o600); the file left behind has
    the mode a plain open() would give under the process's umask (0o644 under 022)."""
    import os

    from brisk.files import atomic_save, current_umask, write_json_atomic

    atomic_save({"x": torch.zeros(2)}, tmp_path / "a.pt", sync=sync)
    write_json_atomic({"a": 1}, tmp_path / "b.json", sync=sync)
    plain = tmp_path / "c.txt"
    plain.write_text("x")
    want = 0o666 & ~current_umask()
    assert {os.stat(tmp_path / n).st_mode & 0o777 for n in ("a.pt", "b.json", "c.txt")} == {want}
