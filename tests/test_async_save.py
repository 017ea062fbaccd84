"""train.async_checkpoint and train.frozen_ref: exact resume, crash safety, frozen weights stored once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from brisk.config import ConfigError
from brisk.models.build import read_checkpoint
from brisk.train.async_save import AsyncCheckpointer, HostSnapshot
from brisk.train.checkpoint import Checkpoints

from .conftest import REPO, run_train, tiny_overrides


def _ckpt(run_dir, step):
    return read_checkpoint(run_dir / "checkpoints" / f"ckpt-{step:08d}.pt")


def test_async_resume_with_frozen_ref_equals_one_synchronous_run(tmp_path):
    """6 steps with today's synchronous full checkpoints == 3 steps, async checkpoint, resume, 3 more."""
    extra = {"train.max_steps": 6, "model.encoder.freeze": True}
    run_train(tmp_path / "sync", **extra, **{"train.async_checkpoint": False, "train.frozen_ref": False})
    run_train(tmp_path / "async", **{**extra, "train.max_steps": 3})
    run_train(tmp_path / "async", **extra, **{"train.resume": True})
    a, b = _ckpt(tmp_path / "sync", 6), _ckpt(tmp_path / "async", 6)
    position = ("step", "epoch", "batches_in_epoch")
    assert [a["trainer"][k] for k in position] == [b["trainer"][k] for k in position] and a["schedule"] == b["schedule"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i][n], sb[i][n]) for i in sa for n in sa[i])
    assert all(torch.equal(x, y) for x, y in [(a["rng"]["torch"], b["rng"]["torch"])])

    # The async checkpoint file holds no encoder weights; they live once in frozen-<hash>.pt.
    raw = torch.load(tmp_path / "async" / "checkpoints" / "ckpt-00000006.pt", weights_only=False)
    assert not any(k.startswith("audio_encoder.") for k in raw["state_dict"])
    assert all(k.startswith("audio_encoder.") for k in raw["frozen_ref"]["keys"])
    assert len(list((tmp_path / "async" / "checkpoints").glob("frozen-*.pt"))) == 1
    rows = [json.loads(line) for line in (tmp_path / "async" / "checkpoints.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6] and all(r["asynchronous"] and r["bytes"] > 0 for r in rows)


def test_tampered_frozen_weights_are_refused(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)
    saver = AsyncCheckpointer(Checkpoints(tmp_path, 2, "loss"), model, torch.device("cpu"))
    saver.save({"state_dict": model.state_dict()}, 1, None)
    saver.close()
    ck = read_checkpoint(tmp_path / "checkpoints" / "ckpt-00000001.pt")
    assert all(torch.equal(ck["state_dict"][k], v) for k, v in model.state_dict().items())
    frozen = next((tmp_path / "checkpoints").glob("frozen-*.pt"))
    torch.save({"0.weight": torch.zeros(3, 3), "0.bias": torch.zeros(3)}, frozen)
    with pytest.raises(ConfigError, match="hash"):
        read_checkpoint(tmp_path / "checkpoints" / "ckpt-00000001.pt")
    frozen.unlink()
    with pytest.raises(ConfigError, match="do not exist"):
        read_checkpoint(tmp_path / "checkpoints" / "ckpt-00000001.pt")


def test_snapshot_is_independent_reused_and_keeps_ties():
    w = torch.ones(4)
    snap = HostSnapshot(pin=False)
    a = snap.take({"sd": {"emb": w, "head": w}, "opt": [torch.zeros(2)], "n": 3})
    assert a["sd"]["emb"] is a["sd"]["head"]  # tied weights stay one tensor (stored once)
    w.add_(1)  # training goes on after the snapshot
    assert torch.equal(a["sd"]["emb"], torch.ones(4))
    ptr = a["sd"]["emb"].data_ptr()
    b = snap.take({"sd": {"emb": w, "head": w}, "opt": [torch.zeros(2)], "n": 3})
    assert b["sd"]["emb"].data_ptr() == ptr and torch.equal(b["sd"]["emb"], w)  # buffer reused, new values


def test_failed_background_write_keeps_previous_checkpoint_and_raises(tmp_path, monkeypatch):
    model = nn.Linear(3, 2)
    ck = Checkpoints(tmp_path, 2, "loss")
    saver = AsyncCheckpointer(ck, model, torch.device("cpu"))
    saver.save({"state_dict": model.state_dict()}, 1, None)
    saver.wait()
    import brisk.models.build as build

    real = build.torch.save

    def crash(obj, f):  # half a file, then the disk fails, on the writer thread
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(build.torch, "save", crash)
    saver.save({"state_dict": model.state_dict()}, 2, None)
    with pytest.raises(RuntimeError, match="background checkpoint write failed"):
        saver.close()
    monkeypatch.setattr(build.torch, "save", real)
    assert ck.latest().name == "ckpt-00000001.pt"
    assert sorted(p.name for p in ck.dir.iterdir()) == ["ckpt-00000001.pt", "index.json"]


KILLED_RUN = """
import sys, time, torch
import brisk.models.build as build
real = torch.save
def slow_save(obj, f, *a, **k):
    if isinstance(obj, dict) and obj.get("trainer", {}).get("step") == 4:
        f.write(b"partial bytes of the second checkpoint")
        f.flush()
        open(sys.argv[1], "w").close()  # tell the test the write is under way
        time.sleep(600)
    return real(obj, f, *a, **k)
build.torch.save = slow_save
from brisk.cli import main
sys.exit(main(["train", *sys.argv[2:]]))
"""


def test_kill_during_background_write_leaves_previous_checkpoint(tmp_path):
    run = tmp_path / "run"
    marker = tmp_path / "writing"
    args = tiny_overrides(run, **{"train.max_steps": 4, "train.save_every": 2, "model.encoder.freeze": True})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(marker), str(REPO / "configs" / "demo.yaml"), *args],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the second checkpoint write never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    folder = run / "checkpoints"
    stale = [p.name for p in folder.iterdir() if p.name.startswith(".ckpt-00000004.pt.")]
    assert stale, "the killed write left no temp file (the test did not kill mid-write)"
    assert list(json.loads((folder / "index.json").read_text())) == ["ckpt-00000002.pt"]
    ck = Checkpoints(run, 3, "loss")
    assert ck.latest().name == "ckpt-00000002.pt"  # the temp file is not trusted
    state = read_checkpoint(ck.latest())
    assert state["trainer"]["step"] == 2 and any(k.startswith("audio_encoder.") for k in state["state_dict"])
    AsyncCheckpointer(ck, nn.Linear(1, 1), torch.device("cpu"))  # a resumed run removes the stale temp file
    assert not any(p.name.startswith(".ckpt-") for p in folder.iterdir())


def test_frozen_file_is_written_before_the_first_checkpoint(tmp_path):
    """start_frozen (called before the graphs compile) writes the frozen weights once; checkpoints only refer to them."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)
    saver = AsyncCheckpointer(Checkpoints(tmp_path, 2, "loss"), model, torch.device("cpu"))
    saver.start_frozen()
    saver.wait()
    frozen = list((tmp_path / "checkpoints").glob("frozen-*.pt"))
    assert len(frozen) == 1 and not list((tmp_path / "checkpoints").glob("ckpt-*.pt"))
    mtime = frozen[0].stat().st_mtime_ns
    saver.save({"state_dict": model.state_dict()}, 1, None)
    saver.close()
    assert frozen[0].stat().st_mtime_ns == mtime  # not written again
    raw = torch.load(tmp_path / "checkpoints" / "ckpt-00000001.pt", weights_only=False)
    assert set(raw["frozen_ref"]["keys"]) == {"0.weight", "0.bias"} and "0.weight" not in raw["state_dict"]
    got = read_checkpoint(tmp_path / "checkpoints" / "ckpt-00000001.pt")["state_dict"]
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())


def test_export_takes_the_trained_weights_from_the_final_snapshot(tmp_path):
    """The export reads trainable weights from the final checkpoint's host buffers (no second device copy),
    frozen ones from the model; the folder holds the model's weights either way."""
    from brisk.models.build import read_state_dict
    from brisk.models.export import export_folder
    from brisk.train.run import build_trainer

    from .conftest import tiny_config

    cfg = tiny_config(tmp_path / "run", **{"train.max_steps": 3, "model.encoder.freeze": True})
    trainer = build_trainer(cfg)
    trainer.fit()
    trainer.close_data()
    own = trainer.model.state_dict()
    state = trainer.export_state()
    assert state is not None and list(state) == list(own)
    buffers = {b.data_ptr() for b in trainer.saver.snapshot.buffers.values()}
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(state[k].data_ptr() in buffers for k in trainable)  # host copies, not the model's
    assert all(state[k].data_ptr() == own[k].data_ptr() for k in own if k.startswith("audio_encoder."))  # frozen: the model's
    assert all(torch.equal(state[k], own[k]) for k in own)
    export_folder(trainer.model, cfg, tmp_path / "model-funasr", "funasr", "fp32", state=state)
    saved = read_state_dict(tmp_path / "model-funasr" / "model.pt")
    assert all(torch.equal(saved[k], own[k]) for k in own)
    trainer.saver.last = (trainer.pos.step - 1, trainer.saver.last[1])  # a snapshot of an earlier step
    assert trainer.export_state() is None  # then the export reads the model


def test_pinned_buffers_only_for_runs_that_will_checkpoint(tmp_path):
    """A measurement run (max_steps inside the first epoch, no save_every, no save_final) allocates no pinned
    checkpoint buffers: pinning GBs in the background held up the steps of the 4B scaling run."""
    from brisk.train.run import build_trainer

    from .conftest import tiny_config

    runs = iter(range(10))

    def ahead(**extra):
        trainer = build_trainer(tiny_config(tmp_path / f"run{next(runs)}", **extra))
        try:
            return trainer.checkpoints_ahead()
        finally:
            trainer.close_data()

    assert not ahead(**{"train.max_steps": 3, "train.save_final": False})
    assert ahead(**{"train.max_steps": 3, "train.save_final": True})
    assert ahead(**{"train.max_steps": 3, "train.save_final": False, "train.save_every": 100})
    assert ahead(**{"train.max_steps": 0, "train.save_final": False})  # whole epochs: checkpoints at each end
