#!/usr/bin/env python3
"""A FunASR jsonl of any size (a million lines by default) over the bundled demo audio, for data-loading
benchmarks: every line is a real line of data/demo's lists (its transcript, speech_length and text_length)
with a new key, its audio path made absolute, so the ~1,500 bundled files are read again and again.

    python tools/make_speech_list.py --out /tmp/speech_1m.jsonl               # 1,000,000 lines
    python tools/make_speech_list.py --out /tmp/speech_10k.jsonl --n 10000
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"


def source_lines() -> list[dict]:
    rows = []
    for name in ("train.jsonl", "train_more.jsonl", "valid.jsonl"):
        for line in (DEMO / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            user = row["messages"][1]
            user["content"] = user["content"].replace("<|startofspeech|>!", f"<|startofspeech|>!{DEMO}/", 1)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    rows = source_lines()
    rng = random.Random(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for i in range(args.n):
            row = rng.choice(rows)
            f.write(json.dumps({**row, "key": f"utt{i:08d}"}, ensure_ascii=False) + "\n")
    print(f"wrote {args.n} lines over {len(rows)} audio files to {args.out}")


if __name__ == "__main__":
    main()
