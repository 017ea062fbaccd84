#!/usr/bin/env python3
"""The whole-run benchmark's speech set: English espeak-ng utterances of 1.5-10 s (mean about 3.6 s).

Sentences come from tools/make_demo_data.py's grammar, 1 to 4 of them an utterance, spoken by its 18
voices at 150-200 words a minute, resampled to 16 kHz with brisk's own resampler and written as
Ogg/Vorbis (about 6 KB a second: 400 utterances fit in ~9 MB, small enough to carry to a GPU machine).
brisk reads them with soundfile like FLAC or WAV. Speaks with the espeak-ng program where it is on PATH,
else with libespeak-ng from the espeakng-loader package (`pip install 'brisk[tools]'`; no program needed).
Writes train.jsonl / valid.jsonl in FunASR's layout
(audio paths relative to the jsonl's folder) and stats.json. The same sentences, voices and rates for a seed
(libespeak-ng's audio may differ by a few samples run to run).

    python tools/make_wholerun_data.py --out bench/tmp/wholerun_data              # 360 + 40
    python tools/make_wholerun_data.py --out bench/tmp/wholerun_tiny --train 8 --valid 2
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import make_demo_data as demo  # noqa: E402  (the grammar, voices, jsonl layout)

# Sentences an utterance and their odds: 2.1 sentences and ~3.6 s an utterance.
SENTENCES = (1, 2, 3, 4)
ODDS = (0.25, 0.4, 0.25, 0.1)
MIN_S, MAX_S = 1.5, 10.0


def speak(text: str, voice: str, rate: int):
    """espeak-ng (the program, else libespeak-ng) -> 16 kHz float waveform (numpy)."""
    import numpy as np
    import torch

    from brisk.data.audio import resample

    pcm, fs = demo.espeak_pcm(text, voice, rate)
    data = torch.from_numpy(np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768.0)
    wave = resample(data, fs, demo.SAMPLE_RATE) * 0.89  # 1 dB headroom for Vorbis
    return wave.clamp(-1, 1).numpy()


def plan(n: int, split: str, rng: random.Random) -> list[dict]:
    out = []
    for i in range(n):
        k = rng.choices(SENTENCES, weights=ODDS)[0]
        text = " and ".join(demo.random_sentence(rng) for _ in range(k))
        out.append({"split": split, "index": i + 1, "text": text, "voice": demo.VOICES[i % len(demo.VOICES)],
                    "rate": rng.randint(*demo.RATE_RANGE), "k": k})
    return out


def make_one(u: dict, out: Path, rng_seed: str) -> dict:
    import soundfile as sf

    rng = random.Random(rng_seed)
    wave = speak(u["text"], u["voice"], u["rate"])
    while len(wave) / demo.SAMPLE_RATE > MAX_S:  # too long: drop the last sentence
        u["text"] = u["text"].rsplit(" and ", 1)[0] if " and " in u["text"] else demo.random_sentence(rng)
        wave = speak(u["text"], u["voice"], u["rate"])
    if len(wave) / demo.SAMPLE_RATE < MIN_S:  # too short: the slowest rate
        u["rate"] = demo.RATE_RANGE[0]
        wave = speak(u["text"] + " and " + demo.random_sentence(rng), u["voice"], u["rate"])
    rel = f"audio/{u['split']}/utt{u['index']:04d}.ogg"
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    sf.write(out / rel, wave, demo.SAMPLE_RATE, format="OGG", subtype="VORBIS")
    return {**u, "rel": rel, "seconds": len(wave) / demo.SAMPLE_RATE}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/wholerun_data")
    ap.add_argument("--train", type=int, default=360)
    ap.add_argument("--valid", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    out = Path(a.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    rng = random.Random(f"wholerun-{a.seed}")
    utts = plan(a.train, "train", rng) + plan(a.valid, "valid", rng)
    with ThreadPoolExecutor(a.jobs) as pool:
        done = list(pool.map(lambda u: make_one(u, out, f"{a.seed}-{u['split']}-{u['index']}"), utts))
    tok = AutoTokenizer.from_pretrained(str(REPO / "data" / "demo" / "tokenizer"), local_files_only=True)
    for split in ("train", "valid"):
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for u in done:
                if u["split"] != split:
                    continue
                utt = demo.Utterance(split, u["index"], u["text"], u["voice"], u["rate"], "ogg")
                rec = demo.jsonl_record(utt, u["seconds"], len(tok(u["text"])["input_ids"]))
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    secs = [u["seconds"] for u in done]
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    stats = {"utterances": len(done), "train": a.train, "valid": a.valid, "seconds_total": round(sum(secs), 1),
             "seconds_mean": round(sum(secs) / len(secs), 2), "seconds_min": round(min(secs), 2),
             "seconds_max": round(max(secs), 2), "bytes": size, "format": "ogg/vorbis 16 kHz mono",
             "seed": a.seed}
    (out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
