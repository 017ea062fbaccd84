"""task: chat through the whole job: `brisk train configs/sft_demo.yaml` (short), its validation loss falling,
exact resume, the HF export, and `brisk eval`'s loss equal to the run's own validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from brisk.config import load_config
from brisk.train.run import train

ROOT = Path(__file__).resolve().parents[1]


def sft(run_dir: Path, *extra: str):
    cfg = load_config(ROOT / "configs" / "sft_demo.yaml", [f"train.output_dir={run_dir}", "train.val_every=10",
                                                           "diagnose.report=false", "train.tensorboard=false", *extra])
    return train(cfg)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_sft_demo_learns_exports_and_evaluates(tmp_path):
    run = tmp_path / "run"
    sft(run, "train.max_steps=30")
    hist = lines(run / "history.jsonl")
    # validated before the first step (the "before"), every 10 steps and at the epoch end
    assert [h["step"] for h in hist][:4] == [0, 10, 20, 25] and hist[-1]["loss"] < hist[0]["loss"] - 0.5
    assert (run / "model-hf" / "model.safetensors").is_file() and (run / "model-hf" / "chat_template.jinja").is_file()
    out = subprocess.run([sys.executable, "-m", "brisk", "eval", str(run), str(ROOT / "data/chat_demo/valid.jsonl"),
                          "--answers", "2", "--max-new-tokens", "16"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    row = next(x for x in out.stdout.splitlines() if x.startswith("| 40 |"))
    assert abs(float(row.split("|")[3]) - hist[-1]["loss"]) < 1e-3  # the same labels, the same loss
    assert out.stdout.count("greedy:") == 2


def test_sft_resume_is_exact(tmp_path):
    sft(tmp_path / "whole", "train.max_steps=8")
    sft(tmp_path / "split", "train.max_steps=4")
    sft(tmp_path / "split", "train.max_steps=8", "train.resume=true")
    whole, split = lines(tmp_path / "whole" / "metrics.jsonl"), lines(tmp_path / "split" / "metrics.jsonl")
    assert [m["step"] for m in split] == list(range(1, 9))
    assert [m["loss"] for m in whole] == [m["loss"] for m in split]
