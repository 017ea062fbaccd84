"""Chat SFT data for model.family=causal_lm: the bundled demo set, or a larger ultrachat-like synthetic set
(`brisk data chat`).

    brisk data chat demo --out data/chat_demo            # the bundled set + its tokenizer
    brisk data chat ultrachat --out /tmp/uc --n 4000     # lengths like ultrachat_200k
    brisk data chat ultrachat_200k --out /tmp/uc200k     # its hub layout, at its size

ultrachat_200k writes the layout the hub ships (``data/train_sft-0000K-of-00003.parquet``, ``data/test_sft-...``;
columns prompt, prompt_id, messages; 207,865 + 23,110 conversations by default, --n / --n-valid to change;
row groups of 1,000 rows) with the lengths below, and the same ``tokenizer/`` folder.

Both write ``train.jsonl`` / ``valid.jsonl`` (one ``{"messages": [...]}`` a line) and a ``tokenizer/`` folder:
the demo speech set's tiny byte-level BPE (data/demo/tokenizer/tokenizer.json, reused as is) with Qwen3's
chat template (``chat_template.jinja``, the template Qwen3 folders ship, as TRL 1.16 stores it) and
``<|im_end|>`` as the end of a turn, so ``apply_chat_template`` renders Qwen3's layout with no download.

demo: short tasks over the demo set's 24 words (repeat, reverse, first word, count), one to three rounds,
a system turn in about half; learnable by a tiny model in minutes, so a falling validation loss means
something.

ultrachat: random words, with the lengths of ultrachat_200k conversations. Published figures:
  - HuggingFaceH4/ultrachat_200k dataset card: train_sft has 207,865 conversations (1,397,058,554 bytes),
    test_sft 23,110; a heavily filtered subset of UltraChat.
  - UltraChat (Ding et al. 2023, "Enhancing Chat Language Models by Scaling High-quality Instructional
    Conversations", arXiv:2305.14233, Table 1 statistics): 3.85 rounds (user + assistant) a dialogue on
    average, 1,467.4 tokens a dialogue, 309.3 tokens an utterance. A copy of the full set on the hub
    (metythorn/ultrachat's card) counts 7.7 turns (utterances) a conversation, the same 3.85 rounds.
Only means are published, and the three UltraChat figures do not agree with two utterances a round
(3.85 x 2 x 309.3 = 2,382, not 1,467.4). We keep the rounds and the dialogue length: rounds = 1 +
Poisson(2.85) capped at 12 (mean ~3.85), utterance tokens log-normal with sigma 0.8 and mean
1,467.4 / (2 x 3.85) = 190.6 (median ~138), cut to [4, 4096]; the shapes are our assumption. Utterance
token counts are exact for the bundled tokenizer (only words that are one token, with or without their
space); the chat template adds ~15 tokens a round.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEMO_TOKENIZER = HERE.parent / "bundled" / "demo" / "tokenizer" / "tokenizer.json"
QWEN3_TEMPLATE = HERE / "chat_templates" / "qwen3.jinja"
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "red", "green", "blue",
         "black", "white", "cat", "dog", "bird", "fish", "house", "tree", "sun", "moon", "star")
ONE_TOKEN = WORDS[:19]  # one token each in the bundled tokenizer, with or without a leading space
NUMBER = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SYSTEM = "You are a helpful assistant."

# ultrachat statistics (see the docstring for the sources)
MEAN_ROUNDS = 3.85
MEAN_DIALOG_TOKENS = 1467.4
MEAN_UTT_TOKENS = MEAN_DIALOG_TOKENS / (2 * MEAN_ROUNDS)
UTT_SIGMA = 0.8


def write_tokenizer(out: Path) -> None:
    tok = out / "tokenizer"
    tok.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DEMO_TOKENIZER, tok / "tokenizer.json")
    shutil.copyfile(QWEN3_TEMPLATE, tok / "chat_template.jinja")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        "model_max_length": 32768, "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "errors": "replace",
    }
    (tok / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def write_jsonl(path: Path, convs: list[list[dict]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i, messages in enumerate(convs):
            f.write(json.dumps({"key": f"{path.stem}_{i:05d}", "messages": messages}) + "\n")


# ------------------------------------------------------------------------------------------------ demo
def demo_round(rng: random.Random) -> tuple[str, str]:
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
    task = rng.choice(("repeat", "reverse", "first", "count"))
    text = " ".join(words)
    answer = {"repeat": text, "reverse": " ".join(reversed(words)), "first": words[0],
              "count": NUMBER[len(words)]}[task]
    return f"{task}: {text}", answer


def demo_conversation(rng: random.Random) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.5 else []
    for _ in range(rng.choice((1, 1, 2, 3))):
        q, a = demo_round(rng)
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return messages


# ------------------------------------------------------------------------------------------- ultrachat
def poisson(rng: random.Random, lam: float) -> int:
    n, p, target = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p < target:
            return n
        n += 1


def utterance_tokens(rng: random.Random) -> int:
    mu = math.log(MEAN_UTT_TOKENS) - UTT_SIGMA ** 2 / 2  # a log-normal's mean is exp(mu + sigma^2 / 2)
    return max(4, min(4096, round(rng.lognormvariate(mu, UTT_SIGMA))))


def ultrachat_conversation(rng: random.Random) -> list[dict]:
    rounds = min(12, 1 + poisson(rng, MEAN_ROUNDS - 1))
    messages = []
    for _ in range(rounds):
        for role in ("user", "assistant"):
            n = utterance_tokens(rng)
            messages.append({"role": role, "content": " ".join(rng.choice(ONE_TOKEN) for _ in range(n))})
    return messages


# ------------------------------------------------------------------------------ ultrachat_200k's layout
def write_ultrachat_200k(out: Path, n_train: int, n_test: int, seed: int) -> None:
    """Parquet shards as the hub ships them. Text is cut from one long random sequence of one-token words,
    so a conversation costs a few slices, not a Python call per word."""
    import hashlib

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    pool_words = 4_000_000
    words = np.array(ONE_TOKEN)[rng.integers(0, len(ONE_TOKEN), pool_words)]
    text = " ".join(words.tolist())
    starts = np.concatenate([[0], np.cumsum([len(w) + 1 for w in words.tolist()])])  # char offset of each word
    mu = math.log(MEAN_UTT_TOKENS) - UTT_SIGMA ** 2 / 2
    (out / "data").mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("prompt", pa.string()), ("prompt_id", pa.string()),
                        ("messages", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())])))])
    for split, n, shards in (("train_sft", n_train, 3), ("test_sft", n_test, 1)):
        bounds = np.linspace(0, n, shards + 1).astype(int)
        for k in range(shards):
            path = out / "data" / f"{split}-{k:05d}-of-{shards:05d}.parquet"
            with pq.ParquetWriter(path, schema) as writer:
                for lo in range(bounds[k], bounds[k + 1], 1000):
                    rows = []
                    for _ in range(lo, min(lo + 1000, bounds[k + 1])):
                        rounds = min(12, 1 + int(rng.poisson(MEAN_ROUNDS - 1)))
                        sizes = np.clip(np.rint(rng.lognormal(mu, UTT_SIGMA, 2 * rounds)), 4, 4096).astype(int)
                        firsts = rng.integers(0, pool_words - 4097, 2 * rounds)
                        messages = [{"content": text[starts[a]:starts[a + m] - 1], "role": ("user", "assistant")[j % 2]}
                                    for j, (a, m) in enumerate(zip(firsts.tolist(), sizes.tolist()))]
                        prompt = messages[0]["content"]
                        rows.append({"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
                                     "messages": messages})
                    writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            print(f"wrote {path}")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("kind", choices=("demo", "ultrachat", "ultrachat_200k"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=None, help="training conversations (demo: 320; ultrachat_200k: 207,865)")
    ap.add_argument("--n-valid", type=int, default=None, help="validation conversations (40; ultrachat_200k: 23,110)")
    ap.add_argument("--seed", type=int, default=1234)


def make(args) -> int:
    if args.kind == "ultrachat_200k":
        write_ultrachat_200k(args.out, args.n or 207_865, args.n_valid or 23_110, args.seed)
        write_tokenizer(args.out)
        return 0
    args.n, args.n_valid = args.n or 320, args.n_valid or 40
    rng = random.Random(args.seed)
    conversation = demo_conversation if args.kind == "demo" else ultrachat_conversation
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "train.jsonl", [conversation(rng) for _ in range(args.n)])
    write_jsonl(args.out / "valid.jsonl", [conversation(rng) for _ in range(args.n_valid)])
    write_tokenizer(args.out)
    print(f"wrote {args.n} + {args.n_valid} conversations and a tokenizer to {args.out}")
    return 0
