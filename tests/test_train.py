"""Training: exact resume, atomic checkpoints with keep-n-best, the non-finite skip, FunASR's schedule."""

from __future__ import annotations

import json
import re

import pytest
import torch

from brisk.data.collate import Collator
from brisk.data.loader import build_split
from brisk.models.build import build_model, read_checkpoint
from brisk.train.checkpoint import Checkpoints
from brisk.train.optim import WarmupLR, build_optimizer
from brisk.train.step import TrainStep

from .conftest import run_train, tiny_config


def _ckpt(run_dir, step):
    return read_checkpoint(run_dir / "checkpoints" / f"ckpt-{step:08d}.pt")


def test_resume_is_exact(tmp_path):
    """2N steps in one run == N steps, resume, N more (N=15 crosses the epoch end at 26 batches)."""
    extra = {"data.num_workers": 1, "train.max_steps": 30}
    run_train(tmp_path / "one", **extra)
    run_train(tmp_path / "two", **{**extra, "train.max_steps": 15})
    run_train(tmp_path / "two", **{**extra, "train.resume": True})
    a, b = _ckpt(tmp_path / "one", 30), _ckpt(tmp_path / "two", 30)
    assert a["trainer"]["epoch"] == 1  # the epoch end was crossed
    assert a["trainer"]["step"] == b["trainer"]["step"] == 30 and a["trainer"]["epoch"] == b["trainer"]["epoch"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    assert a["schedule"] == b["schedule"]


def test_checkpoints_are_atomic_and_keep_n_best(tmp_path, monkeypatch):
    ck = Checkpoints(tmp_path, keep_n=2, metric="loss")
    state = {"state_dict": {"w": torch.ones(3)}}
    for step, loss in [(1, 3.0), (2, 1.0), (3, 2.0), (4, 5.0)]:
        ck.save(state, step, {"loss": loss, "acc": 0.0})
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt-*.pt"))
    assert names == ["ckpt-00000002.pt", "ckpt-00000003.pt", "ckpt-00000004.pt"]  # 2 best + the latest
    assert ck.best().name == "ckpt-00000002.pt" and ck.latest().name == "ckpt-00000004.pt"

    import brisk.models.build as build

    def crash(obj, f):  # half a file, then the machine "dies"
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(build.torch, "save", crash)
    with pytest.raises(OSError):
        ck.save(state, 5, {"loss": 0.5, "acc": 0.0})
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == names + ["index.json"]  # no temp file, nothing lost
    assert "ckpt-00000005.pt" not in json.loads((tmp_path / "checkpoints" / "index.json").read_text())
    assert torch.equal(torch.load(ck.latest(), weights_only=False)["state_dict"]["w"], torch.ones(3))


@pytest.mark.parametrize("fused", [False, True])
def test_non_finite_step_is_skipped(tmp_path, fused):
    cfg = tiny_config(tmp_path)
    model = build_model(cfg).train()
    opt = build_optimizer(model, cfg.optim, fused=fused)
    sched = WarmupLR(opt, cfg.optim.lr, cfg.optim.warmup_steps)
    step = TrainStep(model, opt, sched, grad_clip=5.0, on_device_skip=fused)
    split = build_split(cfg, "train", Collator(), 483)
    batch = split.loader.collate_fn([split.dataset[(i, 0)] for i in split.sampler.batches(0)[0]])
    ok = step([batch])
    assert ok["skipped"].item() == 0 and torch.isfinite(ok["loss"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {id(p): s["exp_avg"].clone() for p, s in opt.state.items()}
    batch.speech[0, 0, 0] = float("nan")  # a broken sample: the loss and gradients turn NaN
    bad = step([batch])
    assert bad["skipped"].item() == 1 and not torch.isfinite(bad["grad_norm"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing was updated
    assert all(torch.equal(moments[id(p)], s["exp_avg"]) for p, s in opt.state.items())


def test_a_dry_step_runs_the_update_kernel_and_changes_nothing(tmp_path):
    """TrainStep.dry (a graph's extra warm-up): the fused update is skipped as for a non-finite norm, so parameters,
    moments and step counts stay as they were; the next real step updates them."""
    cfg = tiny_config(tmp_path)
    model = build_model(cfg).train()
    opt = build_optimizer(model, cfg.optim, fused=True)
    step = TrainStep(model, opt, WarmupLR(opt, cfg.optim.lr, cfg.optim.warmup_steps), grad_clip=5.0,
                     on_device_skip=True)
    split = build_split(cfg, "train", Collator(), 483)
    batch = split.loader.collate_fn([split.dataset[(i, 0)] for i in split.sampler.batches(0)[0]])
    step([batch])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    step.dry = True
    dry = step.body([batch])
    step.dry = False
    assert dry["skipped"].item() == 1 and torch.isfinite(dry["loss"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(state[id(p)][k], v) for p, s in opt.state.items() for k, v in s.items())
    step([batch])
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_warmup_schedule_matches_funasr():
    from funasr.schedulers.warmup_lr import WarmupLR as FunASRWarmupLR

    ref_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
    ref = FunASRWarmupLR(ref_opt, warmup_steps=25)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
    ours = WarmupLR(opt, 2e-4, 25)
    for _ in range(60):
        assert opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-12)
        ref_opt.step()
        ref.step()
        opt.step()
        ours.step()


def test_skip_bad_trains_through_bad_input_and_reports_counts(tmp_path):
    from .conftest import DEMO

    lines = (DEMO / "train.jsonl").read_text(encoding="utf-8").splitlines()[:12]
    lines = [x.replace("!audio/", f"!{DEMO}/audio/") for x in lines]
    lines[3] = "{broken"
    lines[5] = lines[5].replace(f"!{DEMO}/audio/", f"!{tmp_path}/missing/")  # found before training
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF not really a wav file")  # found before training too (its header)
    lines[7] = re.sub(r"!\S+?<\|endofspeech", f"!{tmp_path}/corrupt.wav<|endofspeech", lines[7])
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_train(tmp_path / "run", **{"data.train": str(data), "data.valid": None, "data.skip_bad": True,
                                            "train.max_epochs": 1, "data.shuffle": False})
    assert result["bad_lines"] == 3 and result["bad_samples"] == 0 and result["step"] >= 1
    log = (tmp_path / "run" / "train.log").read_text()
    assert "3 bad jsonl lines" in log and f"{data}:4: not valid JSON" in log
    # both found when the list is indexed, before the model is built, in one warning
    assert (f"2 of 11 audio files do not exist or cannot be decoded; their 2 lines are skipped (data.skip_bad=true), "
            f"first: {data}:6:") in log and f"{data}:8: {tmp_path}/corrupt.wav (" in log  # (soundfile's why)
    assert sum("corrupt.wav" in line for line in log.splitlines()) == 1  # said once, at start, not every epoch


def test_warmup_scaled_to_the_same_tokens(tmp_path):
    """optim.warmup_step_tokens: a recipe's warmup (2,500 steps of 6,000 tokens) at 4x the tokens a step is 625
    steps, and FunASR's schedule then gives the recipe's learning rate at every token count; unset or at the
    recipe's own batch nothing changes; accumulated batches count."""
    from brisk.config import ConfigError
    from brisk.train.optim import schedule_for

    cfg = tiny_config(tmp_path, **{"optim.warmup_steps": 2500, "optim.warmup_step_tokens": 6000,
                                   "data.batch_tokens": 24000})
    lr, steps, notes = schedule_for(cfg)
    assert (lr, steps) == (cfg.optim.lr, 625) and "2500 steps of 6,000 tokens -> 625 steps of 24,000" in notes[0]
    model = torch.nn.Linear(2, 2)
    ref = WarmupLR(torch.optim.AdamW(model.parameters(), lr=1e-3), 1e-3, 2500)
    mine = WarmupLR(torch.optim.AdamW(model.parameters(), lr=1e-3), 1e-3, steps)
    for k in (1, 100, 625, 5000):
        assert mine.lr_at(k) == pytest.approx(ref.lr_at(4 * k), rel=1e-12)
    same = tiny_config(tmp_path, **{"optim.warmup_step_tokens": 3000, "data.batch_tokens": 1500,
                                    "train.accum_grad": 2, "optim.warmup_steps": 100})
    assert schedule_for(same) == (same.optim.lr, 100, [])
    plain = tiny_config(tmp_path, **{"optim.warmup_steps": 100})
    assert schedule_for(plain) == (plain.optim.lr, 100, [])
    with pytest.raises(ConfigError, match="warmup_step_tokens"):
        tiny_config(tmp_path, **{"optim.warmup_step_tokens": -1})


def test_lr_scale_sqrt_scales_the_peak_from_the_batch_it_was_chosen_for(tmp_path):
    """optim.lr_scale=sqrt: at 4x the recipe's tokens a step the peak lr doubles (and the warmup is a quarter);
    at the recipe's own batch nothing changes; without the recipe's batch (warmup_step_tokens) it is one line."""
    from brisk.config import ConfigError
    from brisk.train.optim import schedule_for

    cfg = tiny_config(tmp_path, **{"optim.lr": 1e-4, "optim.warmup_steps": 2500, "optim.warmup_step_tokens": 6000,
                                   "optim.lr_scale": "sqrt", "data.batch_tokens": 24000})
    lr, steps, notes = schedule_for(cfg)
    assert lr == pytest.approx(2e-4, rel=1e-12) and steps == 625 and "lr 0.0001 -> 0.0002" in notes[1]
    same = tiny_config(tmp_path, **{"optim.lr": 1e-4, "optim.warmup_step_tokens": 6000, "optim.lr_scale": "sqrt",
                                    "data.batch_tokens": 6000})
    assert schedule_for(same)[0] == 1e-4
    with pytest.raises(ConfigError, match="optim.lr_scale=sqrt .* optim.warmup_step_tokens"):
        tiny_config(tmp_path, **{"optim.lr_scale": "sqrt"})
    auto = tiny_config(tmp_path, **{"optim.lr_scale": "sqrt", "data.auto_batch.enabled": True})  # it names the batch
    assert auto.optim.warmup_step_tokens == 0 and schedule_for(auto)[0] == auto.optim.lr


def test_a_resume_at_another_schedule_says_so(caplog):
    """A checkpoint's schedule (peak lr, warm-up) other than this run's: the resumed lr is logged, not silent."""
    import logging

    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    with caplog.at_level(logging.INFO, logger="brisk"):
        WarmupLR(opt, 1e-3, 100).load_state_dict({"step_num": 50, "base": 1e-3, "warmup": 100})
        assert not caplog.records
        WarmupLR(opt, 2e-3, 25).load_state_dict({"step_num": 50, "base": 1e-3, "warmup": 100})
    assert "resumed at step 50 with peak lr 0.002 and 25 warm-up steps (the checkpoint's run: 0.001 and 100)" in caplog.text


def test_a_run_logs_its_scaled_warmup(tmp_path):
    run_train(tmp_path, **{"optim.warmup_steps": 40, "optim.warmup_step_tokens": 4000, "data.batch_tokens": 2000,
                           "train.max_steps": 2, "train.save_final": False})
    assert "optim: warmup 40 steps of 4,000 tokens -> 80 steps of 2,000" in (tmp_path / "train.log").read_text()
