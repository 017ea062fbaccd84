"""The state around the step: one step body, resume (device lr, every rank), what is saved under speed switches,
the acceleration record, clean exit, disk space and durable writes. (CUDA-only parts: tests/gpu/.)"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from brisk.config import ConfigError
from brisk.files import DiskSpaceError, atomic_save
from brisk.models.build import build_model, read_checkpoint, read_state_dict
from brisk.models.export import export_folder
from brisk.data.collate import collator_for
from brisk.speed.flags import backend_flags
from brisk.train.checkpoint import Checkpoints
from brisk.train.optim import WarmupLR, build_optimizer, load_optimizer_state
from brisk.train.step import StepHooks, TrainStep

from .conftest import DEMO_CONFIG, REPO, run_train, speed_parts, tiny_config, tiny_overrides

CPU = torch.device("cpu")


def _probe(run_dir: Path, rank: int = 0) -> dict:
    lines = (run_dir / f"probe.rank{rank}.jsonl").read_text().splitlines()[1:]
    return {(r["step"], r["metric"]): r["value"] for r in map(json.loads, lines)}


def _batches(cfg, plan, n=3):
    from brisk.data.loader import build_split

    collator = collator_for(cfg)
    split = build_split(cfg, "train", collator, 483)
    return [collator([split.dataset[(i, 0)] for i in idx]) for idx in split.sampler.batches(0)[:n]]


# ------------------------------------------------------------------------------- 5 and 4: the step body
def _step(cfg, *, fused: bool, clip: float, groups: bool = False):
    model = build_model(cfg).train()
    plan = speed_parts(model, cfg)[2]
    opt = build_optimizer(model, cfg.optim, fused=fused)
    hooks = StepHooks()
    if groups:
        hooks.grad_groups = {id(p): i % 3 for i, p in enumerate(p for p in model.parameters() if p.requires_grad)}
    torch.manual_seed(0)
    return model, plan, TrainStep(model, opt, WarmupLR(opt, 1e-2, 2), grad_clip=clip, on_device_skip=fused, hooks=hooks)


def test_graphed_step_runs_the_eager_body(tmp_path):
    """GraphedStep captures TrainStep.body itself (no second step body): on the CPU, calling its body gives the
    eager step's numbers exactly."""
    from brisk.speed.graph import GraphedStep

    cfg = tiny_config(tmp_path, **{"speed.fused_adamw": True})
    _, plan, eager = _step(cfg, fused=True, clip=0.05, groups=True)
    model2, _, twin = _step(cfg, fused=True, clip=0.05, groups=True)
    graphed = GraphedStep.__new__(GraphedStep)  # __init__ needs CUDA (graph pools); the body does not
    graphed.step = twin
    for i, b in enumerate(_batches(cfg, plan, 2)):
        torch.manual_seed(i)  # the same dropout for both
        a = eager([b])
        torch.manual_seed(i)
        g = graphed._body(b, None)
        twin.advance(g)
        assert a.keys() == g.keys() and "module_norms" in a
        for k in a:
            assert torch.equal(a[k], g[k]), k
    for p, q in zip(eager.params, twin.params):
        assert torch.equal(p, q)


def test_clipping_folded_into_fused_adamw_equals_clipping_in_place(tmp_path):
    """The fused path clips through the kernel's grad_scale, the default path in place: same numbers within
    float rounding, with clipping active (norms far above the clip)."""
    cfg = tiny_config(tmp_path)
    m1, plan, s1 = _step(cfg, fused=True, clip=0.01)
    m2, _, s2 = _step(cfg, fused=False, clip=0.01)
    for i, b in enumerate(_batches(cfg, plan, 3)):
        torch.manual_seed(i)
        a = s1([b])
        torch.manual_seed(i)
        c = s2([b])
        assert float(a["grad_norm"]) > 10 * 0.01
        assert float(a["loss"]) == pytest.approx(float(c["loss"]), rel=1e-5)
    for p, q in zip(s1.params, s2.params):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)


def test_probe_module_norms_are_taken_before_clipping(tmp_path):
    run_train(tmp_path, **{"probe.enabled": True, "probe.param_norm_steps": [1, 3], "optim.grad_clip": 0.01,
                           "train.max_steps": 3, "train.save_final": False})
    rec = _probe(tmp_path)
    for s in (1, 3):
        total = rec[(s, "grad_norm")]
        parts = [v for (st, m), v in rec.items() if st == s and m.startswith("grad_norm.")]
        assert total > 10 * 0.01 and len(parts) > 3
        assert sum(v * v for v in parts) == pytest.approx(total * total, rel=1e-4)


# ------------------------------------------------------------------------------------- 1: the device lr
def test_load_optimizer_state_keeps_the_tensor_lr():
    """load_state_dict swaps a tensor lr for the loaded copy; the graphs and the schedule hold the original."""
    w = torch.nn.Parameter(torch.ones(4))
    lr = torch.tensor(0.5)
    opt = torch.optim.AdamW([w], lr=lr, foreach=False)
    w.grad = torch.ones(4)
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    lr.fill_(0.0)  # as GraphedStep.prepare leaves it between warm-ups
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    saved["param_groups"][0]["lr"] = torch.tensor(0.25)
    plain = torch.optim.AdamW([w], lr=torch.tensor(0.5), foreach=False)
    plain.load_state_dict(saved)
    assert plain.param_groups[0]["lr"] is not lr  # what torch does: the reason for the helper
    load_optimizer_state(opt, saved)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == 0.25
    assert float(opt.state[w]["step"]) == 1.0


# ------------------------------------------------------------------------------ 3: what is saved, bf16
def test_bf16_encoder_saves_the_fp32_originals(tmp_path):
    frozen = {"model.encoder.freeze": True, "model.adaptor.freeze": True, "speed.frozen_eval": True,
              "train.max_steps": 2, "train.export": "funasr", "train.export_dtype": "fp32"}
    cfg = tiny_config(tmp_path, **frozen, **{"speed.encoder_dtype": "bf16"})
    original = build_model(cfg).state_dict()
    run_train(tmp_path, **frozen, **{"speed.encoder_dtype": "bf16"})
    ckpt = read_checkpoint(tmp_path / "checkpoints" / "ckpt-00000002.pt")  # frozen weights by reference, merged
    keys = [k for k in original if k.startswith(("audio_encoder.", "audio_adaptor."))]
    for saved in (ckpt["state_dict"], read_state_dict(tmp_path / "model-funasr" / "model.pt")):
        assert keys and all(saved[k].dtype == torch.float32 and torch.equal(saved[k], original[k]) for k in keys)
    model = build_model(cfg)
    plan = speed_parts(model, cfg)[2]
    assert all(v.dtype == original[k].dtype for k, v in model.state_dict().items())
    assert next(plan.audio.path.audio_encoder.parameters()).dtype == torch.bfloat16  # while compute runs in bf16
    batch = _batches(cfg, plan, 1)[0]
    with torch.no_grad():
        ref = model.audio_rows(batch)
    assert plan.audio(batch).dtype == torch.bfloat16 and torch.allclose(plan.audio(batch).float(), ref, atol=0.1, rtol=0.05)


# ------------------------------------------------------------------------------ 6: acceleration record
def test_accel_state_records_the_tf32_the_run_trains_with(tmp_path):
    from brisk.train.run import build_trainer

    flags = backend_flags()
    build_trainer(tiny_config(tmp_path, **{"speed.tf32": True}))  # data.num_workers=0: nothing to shut down
    state = json.loads((tmp_path / "accel.json").read_text())
    assert state["flags"]["matmul.allow_tf32"] is True and state["flags"]["float32_matmul_precision"] == "high"
    assert "tf32=True" in (tmp_path / "train.log").read_text()
    assert backend_flags() == flags  # recorded inside the scope, restored after


# ------------------------------------------------------------------------------------ 7: a clean exit
def test_fit_shuts_its_data_workers_down(tmp_path):
    from brisk.train.run import build_trainer

    trainer = build_trainer(tiny_config(tmp_path, **{"data.num_workers": 2, "train.max_steps": 2}))
    trainer.fit()
    assert multiprocessing.active_children() == []


def test_brisk_train_exits_soon_after_its_last_line(tmp_path):
    """With persistent workers the process must not linger after its last line (10 s: a correctness bound)."""
    cmd = [sys.executable, "-m", "brisk", "train", str(DEMO_CONFIG), *tiny_overrides(tmp_path),
           "data.num_workers=2", "train.max_steps=3", "train.gc_every=2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    last = time.monotonic()
    for _ in proc.stdout:
        last = time.monotonic()
    rc = proc.wait(timeout=300)
    assert rc == 0 and time.monotonic() - last < 10.0


# --------------------------------------------------------------------------------------- 8: disk space
Usage = namedtuple("Usage", "total used free")


def test_a_run_that_cannot_fit_on_the_disk_is_refused_before_training(tmp_path, monkeypatch):
    from brisk.train.run import build_trainer

    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 200_000, 200_000))
    cfg = tiny_config(tmp_path, **{"train.keep_n": 5, "train.export": "funasr"})
    with pytest.raises(ConfigError) as e:
        build_trainer(cfg)
    msg = str(e.value)
    assert str(tmp_path) in msg and "free" in msg and "train.keep_n=5" in msg and "train.export" in msg
    assert not (tmp_path / "steps.jsonl").exists() or (tmp_path / "steps.jsonl").read_text() == ""


def test_a_write_that_cannot_fit_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(DiskSpaceError, match="needs about"):
        atomic_save({"w": torch.zeros(1000)}, tmp_path / "x.pt")
    cfg = tiny_config(tmp_path / "run")
    with pytest.raises(DiskSpaceError, match="export"):
        export_folder(build_model(cfg), cfg, tmp_path / "model-funasr")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------- 9: durability
def test_renames_are_fsynced_and_stale_temps_removed(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name the fsynced files")
    ck_dir = tmp_path / "checkpoints"
    ck_dir.mkdir()
    stale = [ck_dir / ".ckpt-00000003.pt.k2j4", ck_dir / ".index.json.a1b2", tmp_path / ".model-funasr.zz9"]
    for p in stale[:2]:
        p.write_bytes(b"")
    stale[2].mkdir()
    (stale[2] / "model.pt").write_bytes(b"")
    (ck_dir / "ckpt-00000001.pt").write_bytes(b"keep")
    monkeypatch.setattr(os, "fsync", fsync)
    ck = Checkpoints(tmp_path, keep_n=2, metric="loss")
    assert not any(p.exists() for p in stale) and (ck_dir / "ckpt-00000001.pt").read_bytes() == b"keep"
    ck.save({"state_dict": {"w": torch.ones(3)}}, 2, None)
    assert str(ck_dir) in synced  # the folder, after the checkpoint's and the index's renames
    assert any(s.startswith(str(ck_dir / ".ckpt-00000002.pt.")) for s in synced)
    synced.clear()
    cfg = tiny_config(tmp_path)
    export_folder(build_model(cfg), cfg, tmp_path / "model-funasr")
    assert any(s.startswith(str(tmp_path / ".model-funasr.")) and s.endswith("model.pt") for s in synced)
    assert str(tmp_path) in synced


# -------------------------------------------------------------------------------- 2: torchrun resume
@pytest.mark.slow
def test_torchrun_resume_restores_every_rank(tmp_path):
    """2 gloo processes: 6 steps straight == 3 steps, resume (train.resume=true), 3 more; on both ranks."""
    common = ["train.max_steps=6", "train.save_every=3", "train.keep_n=5", "probe.enabled=true",
              "probe.param_norm_steps=[4,6]"]

    def torchrun(run_dir, *extra):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "brisk", "train",
               str(DEMO_CONFIG), *tiny_overrides(run_dir), *common, *extra]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, out.stderr[-3000:]

    one, two = tmp_path / "one", tmp_path / "two"
    torchrun(one)
    (two / "checkpoints").mkdir(parents=True)
    shutil.copy(one / "checkpoints" / "ckpt-00000003.pt", two / "checkpoints")
    (two / "checkpoints" / "index.json").write_text(json.dumps({"ckpt-00000003.pt": {"step": 3}}))
    torchrun(two, "train.resume=true")

    a, b = (read_checkpoint(d / "checkpoints" / "ckpt-00000006.pt") for d in (one, two))
    assert b["trainer"]["step"] == 6
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    three = read_checkpoint(one / "checkpoints" / "ckpt-00000003.pt")
    r0, r1 = three["rng_ranks"]
    assert not torch.equal(r0["torch"], r1["torch"])  # per-rank RNG saved (seed + rank)
    # Rank 1 resumed at step 3 too (its record starts at step 4), with rank 0's parameters and optimizer
    # state (equal parameter norms after its updates), and continued exactly as it did uninterrupted
    # (its dropout RNG restored: same losses).
    p1, q0, q1 = _probe(one, 1), _probe(two, 0), _probe(two, 1)
    assert min(s for s, _ in q1) == 4
    for s in (4, 6):
        assert q1[(s, "param_norm")] == q0[(s, "param_norm")] == p1[(s, "param_norm")]
    for s in (4, 5, 6):
        assert q1[(s, "loss")] == p1[(s, "loss")]
