"""Qwen3-ASR's data path alone, no model: the official recipe's collator against brisk's loader, one worker each,
on the same utterance groups in the same order, arms interleaved (recipe, brisk, brisk packed, recipe, ...).

    python bench/qwen3_asr_loader.py --out bench/results/<date>-cpu-qwen3-asr-loader     # CPU is enough

What each arm does for a batch, in a torch DataLoader with num_workers=1 (the batches of brisk's own sampler for
bench/configs/bench_qwen3_asr_0p6b.yaml, epoch 0, as bench/qwen3_asr_bench.py times them):
  recipe        QwenLM/Qwen3-ASR finetuning/qwen3_asr_sft.py's DataCollatorForQwen3ASRFinetuning (tests/test_qwen3_asr.py's
                copy) over rows its preprocessing made (the chat template rendered once a row): the audio read in
                the collator, then the processor run twice a batch (full text and prefix alone: log-mel features
                and tokens, each time), left-padded rows
  brisk         brisk's dataset and collator as a run with no speed switch uses them: the audio read and its
                features computed once per utterance in the worker, the prompt tokenised per utterance, padded rows
  brisk_packed  the same samples collated as speed.preset=fast on a GPU does: packed rows in the preset's buckets,
                static shapes for its CUDA graphs
Reported per arm: utterances/s over the whole pass (the worker's start included) and the median batch, with the
spread over --runs. The step figures of bench/qwen3_asr_bench.py are bounded by the data only where a step is
shorter than a batch's time here (with the run's data.num_workers, default 2).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CONFIG = REPO / "bench" / "configs" / "bench_qwen3_asr_0p6b.yaml"  # qwen3_asr_bench.py's batches (6,000 tokens, 32 utterances)


def load(overrides: list[str]):
    from brisk.config import load_config
    from brisk.plan import make_plan

    cfg = load_config(CONFIG, ["data.num_workers=1", *overrides])
    return make_plan(cfg, "cuda")[0] if cfg.speed.preset else cfg  # the GPU's plan: its static packed collation


def groups(n: int) -> list[list[int]]:
    from brisk.bench.harness import llm_vocab
    from brisk.data.collate import Collator
    from brisk.data.loader import build_split

    cfg = load([])
    batches = build_split(cfg, "train", Collator(), llm_vocab(cfg)).sampler.batches(0)
    return [list(b) for b in batches[:n]]


def recipe_loader(idx: list[list[int]]):
    from torch.utils.data import DataLoader
    from transformers import AutoProcessor

    from brisk.families import section
    from brisk.families.qwen3_asr.data import read_lines, target_text
    from tests.test_qwen3_asr import DataCollatorForQwen3ASRFinetuning, make_preprocess_fn_prefix_only

    cfg = load([])
    utts, _ = read_lines(cfg.data.train, cfg)
    processor = AutoProcessor.from_pretrained(cfg.data.tokenizer, local_files_only=True)
    pre = make_preprocess_fn_prefix_only(processor)
    rows = [pre({"audio": u.audio_paths()[0], "text": target_text(u, section(cfg).language), "prompt": ""}) for u in utts]
    return DataLoader(rows, batch_sampler=idx, collate_fn=DataCollatorForQwen3ASRFinetuning(processor), num_workers=1)


def brisk_loader(idx: list[list[int]], packed: bool):
    from torch.utils.data import DataLoader

    from brisk.bench.harness import llm_vocab
    from brisk.data.collate import collator_for
    from brisk.data.loader import build_split

    cfg = load(["speed.preset=fast"] if packed else [])
    split = build_split(cfg, "train", collator_for(cfg), llm_vocab(cfg))
    keys = [[(i, 0) for i in g] for g in idx]  # brisk's dataset takes (utterance, epoch) keys
    collate = collator_for(cfg)
    return DataLoader(split.dataset, batch_sampler=keys, collate_fn=lambda samples: collate(samples), num_workers=1)


def one_pass(loader) -> dict:
    t0 = time.perf_counter()
    marks, utts = [], 0
    for batch in loader:
        marks.append(time.perf_counter())
        utts += batch.n_utts if hasattr(batch, "n_utts") else batch["input_ids"].shape[0]  # brisk, or the recipe's BatchFeature
    wall = time.perf_counter() - t0
    gaps = [b - a for a, b in zip([t0] + marks, marks)]
    return {"wall_s": wall, "utts": utts, "utts_per_s": utts / wall, "first_batch_s": gaps[0],
            "median_batch_ms": 1000 * statistics.median(gaps[1:]) if len(gaps) > 1 else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/qwen3_asr_loader")
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--arms", default="recipe,brisk,brisk_packed")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # the main process only iterates; the worker does the work
    idx = groups(a.batches)
    make = {"recipe": lambda: recipe_loader(idx), "brisk": lambda: brisk_loader(idx, packed=False),
            "brisk_packed": lambda: brisk_loader(idx, packed=True)}
    arms = a.arms.split(",")
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for run in range(a.runs):
        for arm in arms:
            r = one_pass(make[arm]())
            results[arm].append(r)
            print(f"run {run + 1} {arm}: {r['utts']} utterances in {r['wall_s']:.2f} s, {r['utts_per_s']:.1f}/s, "
                  f"median batch {r['median_batch_ms']:.1f} ms", flush=True)
    n_utts = sum(len(g) for g in idx)
    base = statistics.median(r["utts_per_s"] for r in results.get("recipe", [])) if "recipe" in results else None
    rows = ["| arm | utterances/s (median of runs) | spread over runs | median batch | vs recipe |", "|---|---|---|---|---|"]
    for arm in arms:
        ups = [r["utts_per_s"] for r in results[arm]]
        med = statistics.median(ups)
        rows.append(f"| {arm} | {med:.1f} | {min(ups):.1f}-{max(ups):.1f} | "
                    f"{statistics.median(r['median_batch_ms'] for r in results[arm]):.1f} ms | "
                    + (f"{med / base:.2f}x |" if base else "- |"))
    meta = {"date": datetime.now().isoformat(timespec="seconds"), "machine": platform.processor() or platform.machine(),
            "cores": len(__import__("os").sched_getaffinity(0)), "torch": torch.__version__,
            "transformers": __import__("transformers").__version__, "batches": len(idx), "utterances": n_utts,
            "runs": a.runs, "command": " ".join(sys.argv)}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    md = "\n".join(rows)
    (out / "loader.md").write_text(f"# Qwen3-ASR's data path alone, one worker\n\n{json.dumps(meta)}\n\n{md}\n")
    (out / "loader.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
