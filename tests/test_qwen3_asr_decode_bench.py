"""bench/qwen3_asr_decode_bench.py on the CPU (tiny sizes, fp32): every arm runs, and brisk's decoders (plain, the
fast one, several tokens a replay) give transformers' generate ids, utterance for utterance, at batch 1 and 2,
through the whole path: audio files, features, the tower's rows spliced in, the prompt with its forced language."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_brisk_decoders_give_generates_ids_in_fp32(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "qwen3_asr_decode_bench.py"), "--size", "tiny",
                           "--device", "cpu", "--utts", "4", "--slow-utts", "2", "--max-new", "4", "--batches", "1,2",
                           "--arms", "generate,plain,fast,fast_multi", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads((tmp_path / "decode.json").read_text())
    assert {(r["arm"], r["batch"]) for r in got["rows"]} == {(a, b) for a in ("generate", "plain", "fast", "fast_multi")
                                                               for b in (1, 2)}
    assert all(r["tokens"] > 0 for r in got["rows"])
    assert len(got["agreement"]) == 6 and all(d["differ"] == 0 and d["compared"] > 0 for d in got["agreement"].values())
    assert "| fast | 2 | 4 |" in (tmp_path / "decode.md").read_text()
