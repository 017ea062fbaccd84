"""bench/sft_bench.py's own logic on the CPU: an arm that runs out of device memory becomes one table row (the
bench goes on), the memory estimate prints for a model, and the tiny model's brisk arm trains LoRA adapters only."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("sft_bench", ROOT / "bench/sft_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_an_arm_out_of_memory_is_a_row_not_a_crash(bench, monkeypatch, tmp_path):
    cfg = bench.load_cfg("tiny", ROOT / "data/chat_demo", ["data.batch_tokens=4096"])
    monkeypatch.setattr(bench, "load_cfg", lambda *a, **k: cfg)
    monkeypatch.setattr(bench, "groups", lambda cfg, n: [])

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(bench, "run_arm", oom)
    args = type("A", (), dict(model="tiny", data=str(tmp_path), warmup=1, steps=1, arm="d_brisk_fast",
                              out=str(tmp_path), no_profile=True))()
    row = bench.worker(args)
    assert row["error"] == "out of memory at 4,096 tokens a batch" and "tokens_per_s" not in row
    row["peak_gib"] = 131.7
    ok = {"model": "tiny", "arm": "a_loop", "steps": 1, "tokens_per_s": 10.0, "tps_steps": [10.0], "ms_per_step": 1.0,
          "tokens_per_step": 10, "peak_gib": 1.0}
    text = bench.table([ok, row])
    assert "| tiny | d_brisk_fast | out of memory at 4,096 tokens a batch |" in text and "131.7 when it ran out" in text


def test_oom_found_in_a_dead_workers_output(bench):
    assert bench.died_of_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB")
    assert not bench.died_of_oom("RuntimeError: shape mismatch")
    assert bench.oom_text(None) == "out of memory at the config's data.batch_tokens"


def test_a_dead_workers_error_line_skips_progress_bars(bench):
    stderr = "Traceback (most recent call last):\n  File x\nValueError: no conv\n  0%|    | 0/2 [00:00<?, ?it/s]\n"
    assert bench.last_error(stderr) == "ValueError: no conv"
    assert bench.last_error("just a line\n") == "just a line"


def test_estimate_flag_prints_the_floor(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench/sft_bench.py"), "--estimate", "--models", "tiny",
                          "--set", "model.llm.activation_checkpoint=1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| tiny | inputs of 2 checkpointed layers of 2 at 2,048 tokens |" in out.stdout
    assert "| tiny | floor (sum) |" in out.stdout


@pytest.mark.slow
def test_tiny_lora_arms_train_adapters_only(tmp_path):
    """brisk fast and the seed's loop (peft) on the tiny model with LoRA and checkpointing: both rows trained only
    the adapters (the same count), so a LoRA row in the table is a LoRA run."""
    work, out = tmp_path / "work", tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench/sft_bench.py"), "--models", "tiny", "--device", "cpu",
                           "--arms", "a_loop,d_brisk_fast", "--steps", "1", "--warmup", "1", "--no-profile",
                           "--conversations", "40", "--work", str(work), "--out", str(out), "--set",
                           "model.llm.lora.enabled=true", "model.llm.lora.only=true",
                           "model.llm.activation_checkpoint=1"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["arm"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"a_loop", "d_brisk_fast"} and all("tokens_per_s" in r for r in rows.values())
    counts = {arm: r["note"].rpartition("; ")[2] for arm, r in rows.items()}
    trained, _, total = counts["d_brisk_fast"].partition(" of ")
    assert counts["a_loop"] == counts["d_brisk_fast"]  # peft's adapters and brisk's: same layers, same rank
    assert 0 < int(trained.replace(",", "")) < int(total.split()[0].replace(",", "")) / 5
