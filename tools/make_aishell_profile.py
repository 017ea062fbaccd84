"""Write an AISHELL-1-like length profile: (speech_length, text_length) pairs with random features' shapes.

AISHELL-1's published statistics: 120,098 training utterances, about 150 hours, so about 4.5 s an utterance
(1.2 s to 14.5 s), and about 14 Chinese characters a transcript. Durations are drawn from a log-normal with
that mean (spread 0.3 in log space, clipped to the range); text tokens from the character count at about
1.4 characters per Qwen3 token. speech_length counts 10 ms frames exactly as FunASR's scp2jsonl computes it.

    python tools/make_aishell_profile.py --out brisk/bench/profiles/aishell1_like.jsonl
"""

import argparse
import json
import math

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="brisk/bench/profiles/aishell1_like.jsonl")
    ap.add_argument("--n", type=int, default=3600)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    sigma = 0.3
    mu = math.log(4.5) - sigma**2 / 2  # log-normal with mean 4.5 s
    dur = np.clip(rng.lognormal(mu, sigma, args.n), 1.2, 14.5)
    chars = np.clip(np.round(dur / 4.5 * 14 + rng.normal(0, 2.5, args.n)), 2, 60)
    tokens = np.maximum(1, np.round(chars / 1.4)).astype(int)
    with open(args.out, "w", encoding="utf-8") as f:
        for d, t in zip(dur, tokens):
            f.write(json.dumps({"speech_length": int((d * 1000 - 25) // 10 + 1), "text_length": int(t)}) + "\n")
    print(f"{args.n} rows: mean {dur.mean():.2f} s, mean {chars.mean():.1f} characters, {tokens.mean():.1f} tokens")


if __name__ == "__main__":
    main()
