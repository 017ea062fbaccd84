"""Probe: record per-step numbers, compare two records against tolerances, calibrate tolerances."""

from __future__ import annotations

import pytest

from brisk.probe.compare import calibrate, compare, load_record, load_tolerances, render

from .conftest import run_train

STEPS = {"train.max_steps": 8, "probe.enabled": True, "probe.param_norm_steps": [1, 4, 8]}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    runs = {
        "a": {},
        "a_again": {},
        "lr": {"optim.lr": 0.004},
        "batch": {"data.batch_tokens": 1800},
        "bf16": {"model.llm.dtype": "bf16"},
    }
    for name, extra in runs.items():
        run_train(root / name, **STEPS, **extra)
    return {name: load_record(root / name) for name in runs}


def _gates(a, b, rules=None):
    rules = rules or load_tolerances(None)
    checks = compare(a, b, rules)
    unmet = {c.metric.split(".")[0] if c.metric.startswith("batch.") else c.metric for c in checks if not c.met}
    return checks, unmet


def test_record_has_every_documented_metric(records):
    metrics = {m for m, _ in records["a"]}
    for m in ("loss", "grad_norm", "logits_absmean", "logits_std", "argmax_correct", "label_tokens", "skipped",
              "batch.rows", "batch.len", "batch.utts", "batch.tokens", "batch.speech_frames", "param_norm",
              "val_loss", "val_acc"):
        assert m in metrics, m
    assert any(m.startswith("grad_norm.llm.model.layers.") for m in metrics)
    assert {s for m, s in records["a"] if m == "param_norm"} == {1, 4, 8}


def test_identical_runs_meet_every_gate(records):
    checks, unmet = _gates(records["a"], records["a_again"])
    assert checks and not unmet
    assert all(c.diff == 0 for c in checks)


def test_changed_learning_rate_fails_the_loss_gates(records):
    checks, unmet = _gates(records["a"], records["lr"])
    assert {"loss", "val_loss"} <= unmet
    step1 = [c for c in checks if c.metric == "loss" and c.step == 1][0]
    assert step1.met  # the first step's loss is computed before any update: same in both
    text = render(checks, load_tolerances(None), "a", "lr")
    assert "| loss |" in text and "unmet on" in text and "Worst offenders" in text


def test_changed_batching_fails_the_shape_gate(records):
    _, unmet = _gates(records["a"], records["batch"])
    assert "batch" in unmet


def test_lower_precision_moves_numbers_by_bf16_rounding_and_is_reported(records):
    checks, _ = _gates(records["a"], records["bf16"])
    losses = [c for c in checks if c.metric == "loss"]
    worst = max(c.diff / abs(c.a) for c in losses)
    # bf16 keeps 8 mantissa bits (~0.4% per rounding): the loss moves, but by far less than a real change.
    assert 1e-5 < worst < 5e-2, worst
    lr_worst = max(c.diff for c in compare(records["a"], records["lr"], load_tolerances(None)) if c.metric == "loss")
    assert max(c.diff for c in losses) < lr_worst
    text = render(checks, load_tolerances(None), "fp32", "bf16")
    assert "| loss | 8 |" in text


def test_calibrate_proposes_gates_from_the_observed_spread(records):
    rules = load_tolerances(None)
    same = calibrate([records["a"], records["a_again"]], rules, margin=2.0)
    assert same["loss"]["observed"]["max_abs"] == 0 and same["label_tokens"] == {"exact": True, "observed": same["label_tokens"]["observed"]}
    noisy = calibrate([records["a"], records["bf16"]], rules, margin=2.0)
    observed = noisy["loss"]["observed"]["max_abs"]
    assert observed > 0 and noisy["loss"]["abs"] == pytest.approx(2 * observed, rel=1e-2)
    checks = compare(records["a"], records["bf16"], {"loss": noisy["loss"]})
    assert all(c.met for c in checks)  # the bf16 run is within the spread it was calibrated on
    with pytest.raises(ValueError, match="shares no checkpoint"):
        calibrate([records["a"], {}], rules, 2.0)
