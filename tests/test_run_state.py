"""A run's state in one module (brisk/train/run_state.py): the resume's config checked against the run's before the
folder is touched, the checkpoint chosen, restored (model, optimizer, schedule, RNG, position) and what it did
reported. End-to-end exact resumes: tests/test_train.py, test_sft_run.py, test_first_hour.py, test_ship.py."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from brisk.config import ConfigError
from brisk.train import run_state
from brisk.train.checkpoint import rng_state
from brisk.train.optim import WarmupLR

from .conftest import tiny_config


def _folder(run: Path, saved: dict) -> Path:
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(saved), encoding="utf-8")
    (run / "checkpoints" / "ckpt-00000003.pt").write_bytes(b"")  # present: there is something to resume
    return run


def test_check_refuses_a_model_or_data_change_and_returns_the_allowed_ones(tmp_path):
    saved = {"model": {"family": "causal_lm", "llm": {"config": {"hidden_size": 128}}}, "causal_lm": {"max_len": 512},
             "train": {"max_steps": 4, "log_every": 10, "resume": False}, "optim": {"lr": 0.001}}
    run = _folder(tmp_path / "run", saved)
    now = {**saved, "train": {"max_steps": 6, "log_every": 3, "resume": True}, "optim": {"lr": 0.002}}
    # the resume itself and optim.lr (warned about after the restore) are not in the list
    assert run_state.check_resume(run, now) == ["train.log_every: 10 -> 3", "train.max_steps: 4 -> 6"]
    bad = {**now, "model": {"family": "causal_lm", "llm": {"config": {"hidden_size": 64}}}, "causal_lm": {"max_len": 256}}
    with pytest.raises(ConfigError, match=r"config.yaml\); refused, nothing in the folder changed: "
                                          r"causal_lm.max_len: 512 -> 256; model.llm.config.hidden_size: 128 -> 64"):
        run_state.check_resume(run, bad)
    # a run an older brisk saved, with the key under its old name (data.max_len), is compared under the new one
    old = _folder(tmp_path / "old", {**{k: v for k, v in saved.items() if k != "causal_lm"}, "data": {"max_len": 512}})
    with pytest.raises(ConfigError, match=r"causal_lm.max_len: 512 -> 256"):
        run_state.check_resume(old, {**now, "causal_lm": {"max_len": 256}})
    assert run_state.check_resume(tmp_path / "empty", bad) == []  # no checkpoint: a fresh start, nothing to check


def test_check_logs_the_allowed_changes_only_for_a_resume(tmp_path, caplog):
    cfg = tiny_config(tmp_path / "run", **{"train.max_steps": 4})
    run = _folder(tmp_path / "run", cfg.to_dict())
    assert run_state.check(cfg) == []  # not a resume: nothing read
    cfg = tiny_config(run, **{"train.max_steps": 6, "train.resume": True})
    with caplog.at_level("INFO", logger="brisk"):
        assert run_state.check(cfg) == ["train.max_steps: 4 -> 6"]
    assert "resume: 1 allowed change: train.max_steps: 4 -> 6" in caplog.text


def test_trim_step_logs_drops_the_lines_past_the_checkpoint_and_a_torn_one(tmp_path):
    lines = [json.dumps({"step": s}) for s in range(1, 6)] + ['{"step": 6, "lo']
    (tmp_path / "steps.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 2}) + "\n")
    assert run_state.trim_step_logs(tmp_path, 3) == 3
    assert [json.loads(x)["step"] for x in (tmp_path / "steps.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (tmp_path / "metrics.jsonl").read_text() == json.dumps({"step": 2}) + "\n"


def _parts(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return SimpleNamespace(model=model, optimizer=opt, schedule=WarmupLR(opt, 1e-2, 2), sharded=False,
                           accel=SimpleNamespace(audio=None), ranks=SimpleNamespace(rank=0))


def test_resume_restores_model_optimizer_schedule_rng_and_position(tmp_path, caplog):
    a = _parts(0)
    for _ in range(2):
        a.schedule.step()
        a.model(torch.randn(2, 4)).sum().backward()
        a.optimizer.step()
    cfg = tiny_config(tmp_path / "run", **{"train.resume": True})
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    path = run / "checkpoints" / "ckpt-00000002.pt"
    trainer = {"step": 2, "epoch": 1, "batches_in_epoch": 5, "bad_samples": 1, "history": [{"step": 2, "loss": 1.5}]}
    torch.save({"state_dict": a.model.state_dict(), "optimizer": a.optimizer.state_dict(),
                "schedule": a.schedule.state_dict(), "trainer": trainer, "rng": rng_state(),
                "config": {**cfg.to_dict(), "optim": {**cfg.to_dict()["optim"], "lr": 0.5}}}, path)
    expected = (torch.rand(3), random.random())  # what the generators give right after the save
    (run / "steps.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 5)))

    b = _parts(1)
    ckpts = SimpleNamespace(latest_intact=lambda: path)  # rank 0's checkpoint list
    with caplog.at_level("INFO", logger="brisk"):
        pos = run_state.resume(cfg, b, ckpts, run)
    assert (pos.step, pos.epoch, pos.batches_in_epoch, pos.bad_samples, pos.history) == (2, 1, 5, 1, trainer["history"])
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    assert b.schedule.state_dict() == a.schedule.state_dict()
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    assert [json.loads(x)["step"] for x in (run / "steps.jsonl").read_text().splitlines()] == [1, 2]
    assert "resumed from" in caplog.text and "optim.lr: 0.5 -> " in caplog.text  # restored, and what differs


def test_resume_with_nothing_to_resume_starts_fresh_and_says_so(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.jsonl").write_text(json.dumps({"step": 1}) + "\n")  # a run killed before its first checkpoint
    cfg = tiny_config(run, **{"train.resume": True})
    with caplog.at_level("INFO", logger="brisk"):
        pos = run_state.resume(cfg, _parts(0), SimpleNamespace(latest_intact=lambda: None), run)
    assert pos == run_state.Position() and (run / "steps.jsonl").read_text() == ""
    assert "nothing to resume" in caplog.text


def test_a_file_without_trainer_state_is_refused(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"state_dict": {}}, path)
    cfg = tiny_config(tmp_path / "run", **{"train.resume_from": str(path)})
    assert run_state.choose(cfg, None) == path  # train.resume_from wins over the folder's checkpoints
    with pytest.raises(ConfigError, match="not a brisk checkpoint"):
        run_state.restore(_parts(0), path)
