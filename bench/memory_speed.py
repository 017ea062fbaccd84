"""Memory and speed of bigger decoders on one GPU: full fine-tuning with and without activation checkpointing,
and LoRA, each at the largest batch that fits (data.auto_batch's search).

    OUT=/tmp/ms python bench/memory_speed.py                     # 0.6B, 1.7B, 4B decoders; about 6-8 minutes on an H200
    python bench/memory_speed.py --sizes 4B --arms full --steps 6 --out DIR [key=value ...]

Fun-ASR-Nano-shaped models with random weights (configs/fun_asr_nano.yaml, fun_asr_1p7b.yaml, fun_asr_4b.yaml:
the real SANM encoder and adaptor, frozen, and a Qwen3-0.6B/1.7B/4B-sized bf16 decoder) on the AISHELL-1-like
length profile, in this process (one model at a time, freed before the next). Every arm runs the eager packed
step (speed.packing, frozen_eval, fused_adamw, encoder_dtype=bf16, label_head, SDPA without cuDNN): compile
and CUDA graphs are left out so that an arm costs seconds, not a compile, and every budget is one shape more.

For each (decoder, arm): one training step (model, optimizer, speed plan) is built; brisk.bench.autobatch's binary search
over --candidates (data.batch_tokens, data.max_utts scaled with it) keeps the largest whose heaviest batch
peaks under --memory-frac of the GPU; then --warmup + --steps batches of that budget are timed (CUDA-synced
per step). tokens/s counts real LLM tokens. MFU = model FLOPs (torch's FlopCounterMode over forward and
backward of one batch, per LLM token; the checkpointed arm uses the plain arm's count, so recomputation is
not counted as useful work) x tokens/s / --peak-tflops (H200 dense bf16: 989). Peak GiB is
torch.cuda.max_memory_allocated over the timed steps. Results go to $OUT/memory_speed.json as they come; the
markdown table is printed last (and written to $OUT/memory_speed.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SIZES = {"0.6B": "configs/fun_asr_nano.yaml", "1.7B": "configs/fun_asr_1p7b.yaml", "4B": "configs/fun_asr_4b.yaml"}
ARMS = {
    "full": [],
    "full + activation ckpt": ["model.llm.activation_checkpoint=1"],
    "LoRA r16 q_proj+v_proj": ["model.llm.lora.enabled=true", "model.llm.freeze=true"],
}
BASE = [f"data.profile={REPO / 'brisk/bench/profiles/aishell1_like.jsonl'}", "data.train=null", "data.valid=null",
        "data.num_workers=0", "train.device=cuda", "train.parallel=ddp", "speed.packing=true", "speed.frozen_eval=true",
        "speed.fused_adamw=true", "speed.encoder_dtype=bf16", "speed.label_head=true",
        "speed.sdpa_backends=[flash,efficient,math]", "optim.warmup_steps=10"]
CANDIDATES = [6000, 12000, 24000, 48000, 96000, 192000, 384000, 768000]  # 384k fit 0.6B and 1.7B in round 3b


def measure(size: str, arm: str, args, flops_per_token: dict) -> dict:
    import torch

    from brisk.bench.harness import count_flops, llm_vocab, sample_stream
    from brisk.config import load_config
    from brisk.bench.autobatch import largest_fitting, scaled, trial_runner

    cfg = load_config(REPO / SIZES[size], BASE + ARMS[arm] + [
        f"data.auto_batch.candidates={args.candidates}", f"data.auto_batch.memory_frac={args.memory_frac}",
        "data.auto_batch.trial_batches=8", *args.overrides])
    total = torch.cuda.get_device_properties(0).total_memory
    t0 = time.perf_counter()
    with trial_runner(cfg) as (runner, peak_of):
        build_s = runner.setup_seconds
        trainable = sum(p.numel() for p in runner.model.parameters() if p.requires_grad)
        search = largest_fitting(peak_of, cfg.data.auto_batch.candidates, args.memory_frac * total)
        search_s = time.perf_counter() - t0 - build_s
        out = {"size": size, "arm": arm, "trainable": trainable, "build_s": build_s, "search_s": search_s,
               "peaks_gib": {str(c): (None if p == float("inf") else p / 2**30) for c, p in sorted(search.peaks.items())},
               "row_tokens": {str(c): n for c, n in sorted(peak_of.rows.items())}, "batch_tokens": search.best}
        if search.best is None:
            return {**out, "error": f"no candidate fits under {args.memory_frac:.0%} of the GPU"}
        best = scaled(cfg, search.best)
        stream = [runner.collate(s) for s in sample_stream(best, args.warmup + args.steps, llm_vocab(best))]
        key = (size, "lora" if "lora" in arm.lower() else "full")
        if key not in flops_per_token and "ckpt" not in arm:
            b = stream[0]
            flops_per_token[key] = count_flops(runner, [b]) / b.n_tokens
        for b in stream[: args.warmup]:
            runner.run(b)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times, tokens = [], 0
        for b in stream[args.warmup:]:
            s0 = time.perf_counter()
            runner.run(b)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - s0)
            tokens += b.n_tokens
        peak = torch.cuda.max_memory_allocated() / 2**30
    tps = tokens / sum(times)
    fpt = flops_per_token.get(key)
    return {**out, "max_utts": best.data.max_utts, "steps": len(times), "step_median_s": statistics.median(times),
            "step_mean_s": statistics.fmean(times), "tokens_per_step": tokens / len(times), "tokens_per_s": tps,
            "peak_gib": peak, "flops_per_token": fpt,
            "mfu": (fpt * tps / (args.peak_tflops * 1e12)) if fpt else None, "wall_s": time.perf_counter() - t0}


def table(rows: list[dict], gpu: str, args) -> str:
    lines = [f"Memory and speed on one {gpu}: eager packed step (label_head, fused AdamW, bf16 decoder, frozen bf16 "
             f"encoder), batch = the largest data.batch_tokens of {args.candidates} whose trial peak is under "
             f"{args.memory_frac:.0%} of the GPU; {args.steps} timed steps after {args.warmup}; MFU against "
             f"{args.peak_tflops:g} TFLOP/s.", "",
             "| decoder | arm | trainable params | batch_tokens (max_utts) | LLM tokens/step | step median | tokens/s | "
             "peak GiB | MFU | search |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['size']} | {r['arm']} | | failed: {r.get('error', '')} | | | | | | |")
            continue
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a"
        lines.append(f"| {r['size']} | {r['arm']} | {r['trainable'] / 1e6:,.1f} M | {r['batch_tokens']} ({r['max_utts']}) | "
                     f"{r['tokens_per_step']:,.0f} | {r['step_median_s'] * 1000:.0f} ms | {r['tokens_per_s']:,.0f} | "
                     f"{r['peak_gib']:.1f} | {mfu} | {r['search_s']:.0f} s, {len(r['peaks_gib'])} trials |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, from {', '.join(SIZES)}")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--candidates", type=lambda s: [int(x) for x in s.split(",")], default=CANDIDATES)
    ap.add_argument("--memory-frac", type=float, default=0.85)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--budget", type=float, default=450, help="seconds; arms not started by then are skipped")
    ap.add_argument("--out", default=os.environ.get("OUT", str(REPO / "bench/tmp/memory_speed")))
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every arm")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    t0 = time.perf_counter()
    rows, flops = [], {}
    for size in args.sizes.split(","):
        for arm in args.arms.split(","):
            if time.perf_counter() - t0 > args.budget:
                rows.append({"size": size, "arm": arm, "error": f"skipped: past --budget {args.budget:g} s"})
                continue
            try:
                r = measure(size, arm, args, flops)
            except Exception as e:  # noqa: BLE001 - one failed arm must not lose the table
                r = {"size": size, "arm": arm, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            gc.collect()
            torch.cuda.empty_cache()
            rows.append(r)
            print(json.dumps(r), flush=True)
            (out / "memory_speed.json").write_text(json.dumps(
                {"gpu": gpu, "torch": torch.__version__, "args": {k: v for k, v in vars(args).items()}, "rows": rows},
                indent=1, default=str))
    text = table(rows, gpu, args)
    (out / "memory_speed.md").write_text(text)
    print(f"\n(total {time.perf_counter() - t0:.0f} s)\n")
    print(text)


if __name__ == "__main__":
    main()
