"""Qwen3-ASR fine-tuning on one GPU: the official recipe as its users run it against brisk's defaults and brisk's
``speed.preset=fast``, on the same model (a random Qwen3-ASR of 0.6B's sizes), the same utterance groups, in
the same order, arms interleaved (A B C D, A B C D).

    python bench/qwen3_asr_bench.py --out $OUT                       # GPU: every arm, --runs 2, table last
    python bench/qwen3_asr_bench.py --size tiny --device cpu --steps 2 --warmup 1 --runs 1   # smoke test

Arms (each run a fresh process; ms a step = the optimizer step's wall time, host and device, median of the
timed steps; utterances and LLM tokens a step are the same in every arm):
  recipe          QwenLM/Qwen3-ASR finetuning/qwen3_asr_sft.py: transformers' Trainer (CastFloatInputsTrainer,
                  bf16=True, the model's weights in bf16, AdamW), its DataCollatorForQwen3ASRFinetuning
                  (tests/test_qwen3_asr.py's faithful copy) on the same utterance groups; every weight trains
  brisk_default   brisk's step, every switch off (padded rows, eager); decoder weights bf16 under autocast, audio
                  tower and projector fp32; every weight trains (the recipe's work)
  brisk_fast_all  speed.preset=fast with the audio tower and projector training (packing, compiled decoder
                  layers and tower blocks, fused AdamW, label_head, fused projections, audio_varlen): the recipe's
                  work, brisk's path; the whole step, tower included, one CUDA graph a bucket (from the tower's
                  static inputs), captured before timing
  brisk_fast_all_nograph  brisk_fast_all with speed.cuda_graph=false and speed.fresh_grads=false (the tower eager,
                  its blocks not compiled): what the graph is worth with every weight training
  brisk_fast      speed.preset=fast as shipped: also the frozen bf16 audio path (frozen_eval, encoder_dtype),
                  which needs model.encoder.freeze and model.adaptor.freeze (the usual fine-tune keeps the
                  audio tower frozen; the recipe trains it): less work, named as such; and with the audio frozen
                  the step is one CUDA graph a bucket (speed.cuda_graph, fresh_grads), captured before timing,
                  and so is the frozen tower (its chunks, rows and windows padded per bucket by the tower
                  itself, under audio_varlen): a step is a few launches that gather the real chunks, then two
                  replays
  brisk_fast_nograph  brisk_fast with speed.cuda_graph=false and speed.fresh_grads=false: what the graph is worth
  brisk_fast_gc   brisk_fast with train.gc_every (Python's collector frozen after the first step, as brisk train
                  does with that setting): whether a collection lands inside timed steps (only when --arms names it)
  brisk_fast_nav  brisk_fast with speed.audio_varlen=false (transformers' per-window audio attention): what the
                  one-call audio attention is worth (only when --arms names it)
Packed arms use the preset's own bucket lengths (speed.pack_buckets).
Tokens: the bundled demo processor's tokenizer (392 words and characters, ids inside the 151,936 vocabulary),
so a step's LLM tokens follow the bundled set, not Qwen3's BPE.
Wheels: the GPU image's transformers may predate qwen3_asr (5.24 has it): --wheels installs transformers (and
soundfile, cffi) from a folder with --no-deps into a private folder first on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARMS = ("recipe", "brisk_default", "brisk_fast_all", "brisk_fast_all_nograph", "brisk_fast", "brisk_fast_nograph")  # the default --arms
# (brisk_fast_nav on request)
SIZES = {"0p6b": "bench/configs/bench_qwen3_asr_0p6b.yaml", "tiny": "configs/qwen3_asr_demo.yaml"}


def load_cfg(args, extra: list[str]):
    from brisk.config import load_config

    base = [f"train.device={args.device}", "data.num_workers=0", f"train.output_dir={Path(args.out) / 'run'}",
            "model.encoder.freeze=false", "model.adaptor.freeze=false"]
    if args.size == "tiny":
        base += ["model.llm.dtype=bf16"] if args.device == "cuda" else []
    return load_config(REPO / SIZES[args.size], base + extra)


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def groups(args) -> list[list[int]]:
    """Utterance indices of the first warmup + steps batches of brisk's sampler (identical in every arm)."""
    from brisk.bench.harness import llm_vocab
    from brisk.data.collate import Collator
    from brisk.data.loader import build_split

    cfg = load_cfg(args, [])
    split = build_split(cfg, "train", Collator(), llm_vocab(cfg))
    batches = split.sampler.batches(0)
    n = args.warmup + args.steps
    return [list(b) for b in (batches * (n // len(batches) + 1))[:n]]


def brisk_arm(args, idx: list[list[int]]) -> tuple[list[float], str]:
    from brisk.bench.harness import build_runner, llm_vocab
    from brisk.data.loader import build_split
    from brisk.train.trainer import freeze_gc

    extra = {"brisk_default": [],
             "brisk_fast_all": ["speed.preset=fast"],
             "brisk_fast_all_nograph": ["speed.preset=fast", "speed.cuda_graph=false", "speed.fresh_grads=false"],
             "brisk_fast": ["speed.preset=fast", "model.encoder.freeze=true", "model.adaptor.freeze=true"],
             "brisk_fast_nav": ["speed.preset=fast", "model.encoder.freeze=true", "model.adaptor.freeze=true",
                                "speed.audio_varlen=false"],
             "brisk_fast_nograph": ["speed.preset=fast", "model.encoder.freeze=true", "model.adaptor.freeze=true",
                                    "speed.cuda_graph=false", "speed.fresh_grads=false"],
             "brisk_fast_gc": ["speed.preset=fast", "model.encoder.freeze=true", "model.adaptor.freeze=true",
                               "train.gc_every=1000"]}[args.arm]
    cfg = load_cfg(args, extra)
    runner = build_runner(cfg)

    split = build_split(runner.cfg, "train", runner.parts.collator, llm_vocab(cfg))
    batches = [runner.collate([split.dataset[(i, 0)] for i in g]) for g in idx]
    times = []
    for i, b in enumerate(batches):
        sync(args.device)
        t0 = time.perf_counter()
        runner.run(b)
        sync(args.device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
        if i == 0 and cfg.train.gc_every:  # what brisk train does after its first step
            freeze_gc()
    from brisk.speed.compile import compile_counters

    note = "; ".join(runner.parts.plan.notes + tuple(runner.parts.accel.notes)) or "no switch"
    counts = compile_counters()  # a recompile inside the timed steps shows as one slow step; these say how many
    return times, note + f"; dynamo: {counts.get('graphs', 0)} graphs, {counts.get('recompiles', 0)} recompiles" \
        + audio_ms(args, runner, batches[args.warmup:])


def audio_ms(args, runner, batches) -> str:
    """The audio rows' share of a graphed step, synced wall time (host and device): the frozen tower's inputs
    gathered and its graph replayed (GraphedAudioInputs, the preset), or the tower run eagerly before the step's
    replay (without audio_varlen); either way the part of the step before the step graph's replay."""
    audio = getattr(runner.step, "audio", None)
    if audio is None:
        return ""
    ms = []
    from brisk.speed.flags import run_scope

    with run_scope(runner.cfg):
        for b in batches[:10]:
            b = b.to(runner.parts.device)
            sync(args.device)
            t0 = time.perf_counter()
            audio(b)
            sync(args.device)
            ms.append(1000 * (time.perf_counter() - t0))
    what = "tower graph" if type(getattr(runner.step, "encoder", None)).__name__ == "GraphedAudioInputs" else "eager"
    return f"; audio rows outside the step graph ({what}): median {statistics.median(ms):.1f} ms (" + \
        ", ".join(f"{m:.1f}" for m in ms) + ")"


def recipe_arm(args, idx: list[list[int]]) -> tuple[list[float], str]:
    import torch
    from torch.utils.data import DataLoader
    from transformers import (AutoProcessor, Qwen3ASRForConditionalGeneration, Trainer, TrainerCallback,
                              TrainingArguments)

    from brisk.families import section
    from brisk.families.qwen3_asr.data import read_lines, target_text
    from brisk.families.qwen3_asr.model import hf_config
    from tests.test_qwen3_asr import DataCollatorForQwen3ASRFinetuning, make_preprocess_fn_prefix_only

    cfg = load_cfg(args, [])
    utts, _ = read_lines(cfg.data.train, cfg)
    processor = AutoProcessor.from_pretrained(cfg.data.tokenizer, local_files_only=True)
    pre = make_preprocess_fn_prefix_only(processor)
    rows = [pre({"audio": u.audio_paths()[0], "text": target_text(u, section(cfg).language), "prompt": ""})
            for g in idx for u in (utts[i] for i in g)]
    sizes = [len(g) for g in idx]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    sampler = [list(range(a, a + k)) for a, k in zip(starts, sizes)]
    use_bf16 = args.device == "cuda"
    with torch.device(args.device):
        model = Qwen3ASRForConditionalGeneration(hf_config(cfg.model)).to(torch.bfloat16 if use_bf16 else torch.float32)
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            sync(args.device)
            marks.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            sync(args.device)
            marks.append(time.perf_counter())

    class CastFloatInputsTrainer(Trainer):  # the recipe's own subclass
        def _prepare_inputs(self, inputs):
            inputs = super()._prepare_inputs(inputs)
            model_dtype = getattr(self.model, "dtype", None)
            if model_dtype is not None:
                for k, v in list(inputs.items()):
                    if torch.is_tensor(v) and v.is_floating_point():
                        inputs[k] = v.to(dtype=model_dtype)
            return inputs

        def get_train_dataloader(self):  # the other arms' groups, in order
            return self.accelerator.prepare(DataLoader(rows, batch_sampler=sampler, collate_fn=self.data_collator))

    targs = TrainingArguments(output_dir=str(Path(args.out) / "recipe"), per_device_train_batch_size=max(sizes),
                              gradient_accumulation_steps=1, learning_rate=2e-5, max_steps=len(idx),
                              lr_scheduler_type="linear", logging_steps=1000,
                              warmup_steps=max(1, round(0.02 * len(idx))),  # the recipe's warmup_ratio=0.02 (gone in 5.x), save_strategy="no",
                              bf16=use_bf16, remove_unused_columns=False, report_to="none",
                              dataloader_num_workers=0, use_cpu=args.device == "cpu")
    CastFloatInputsTrainer(model=model, args=targs, train_dataset=rows,
                           data_collator=DataCollatorForQwen3ASRFinetuning(processor), callbacks=[Clock()]).train()
    times = [marks[2 * i + 1] - marks[2 * i] for i in range(len(marks) // 2)][args.warmup:]
    return times, "transformers Trainer, bf16, the recipe's collator (left-padded rows)"


def worker(args) -> dict:
    import torch

    sys.path.insert(0, str(REPO))
    from brisk.train.threads import pick_threads

    pick_threads(load_cfg(args, []), torch.device(args.device))  # the recipe's arm on the config's host threads too
    torch.manual_seed(0)
    idx = groups(args)
    times, note = (recipe_arm if args.arm == "recipe" else brisk_arm)(args, idx)
    return {"arm": args.arm, "run": args.run, "steps": len(times), "ms_steps": [1000 * t for t in times],
            "ms_median": 1000 * statistics.median(times), "utts_per_step": statistics.mean(len(g) for g in idx),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0.0, "note": note}


def table(rows: list[dict]) -> str:
    """Median ms a step per arm (over runs: the median of each run's median, and the runs' spread)."""
    out = ["| arm | ms a step (median of runs) | runs' medians | vs recipe | peak GiB | utts/step |", "|---|---|---|---|---|---|"]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["arm"], []).append(r)
    ok = {a: [r for r in rs if "ms_median" in r] for a, rs in by.items()}
    base = statistics.median(r["ms_median"] for r in ok.get("recipe", [])) if ok.get("recipe") else None
    for arm, rs in ok.items():
        if not rs:
            out.append(f"| {arm} | FAILED: {by[arm][0].get('error', '?')[:80]} | | | | |")
            continue
        med = statistics.median(r["ms_median"] for r in rs)
        ratio = f"{base / med:.2f}x" if base else "-"
        runs = ", ".join(f"{r['ms_median']:.1f}" for r in rs)
        out.append(f"| {arm} | {med:.1f} | {runs} | {ratio} | "
                   f"{max(r['peak_gib'] for r in rs):.1f} | {rs[0]['utts_per_step']:.1f} |")
    return "\n".join(out)


def driver(args) -> None:
    out = Path(args.out or os.environ.get("OUT") or REPO / "bench/tmp/qwen3_asr_bench")
    out.mkdir(parents=True, exist_ok=True)
    paths = [str(REPO)]
    if args.wheels:
        from sft_bench import install  # this folder: the script's own

        paths.append(str(install(Path(args.wheels), Path(args.work) / "site",
                                 ["transformers", "soundfile", "cffi", "pycparser"])))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
           "TOKENIZERS_PARALLELISM": "false", "TORCHINDUCTOR_CACHE_DIR": str(Path(args.work) / "inductor")}
    rows, deadline = [], time.time() + args.budget_s
    for run in range(args.runs):
        for arm in args.arms.split(","):
            if time.time() > deadline:
                rows.append({"arm": arm, "run": run, "error": "skipped: out of the time budget"})
                continue
            cmd = [sys.executable, __file__, "--worker", "--arm", arm, "--run", str(run), "--size", args.size,
                   "--out", str(out), "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device]
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO,
                                      timeout=max(30, deadline + 60 - time.time()))
                text, err = proc.stdout + proc.stderr, (proc.stderr.strip().splitlines() or ["?"])[-1]
                line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT ")), None)
            except subprocess.TimeoutExpired as e:
                text, err, line = str(e.stdout or "") + str(e.stderr or ""), "timed out", None
            (out / f"log_{arm}_{run}.txt").write_text(text, encoding="utf-8")
            row = json.loads(line[7:]) if line else {"arm": arm, "run": run, "error": err}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print("\n" + table(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arm")
    ap.add_argument("--run", type=int, default=0)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--size", default="0p6b", choices=sorted(SIZES))
    ap.add_argument("--steps", type=int, default=20, help="timed steps a run")
    ap.add_argument("--warmup", type=int, default=5, help="steps a run before timing (compile, shapes)")
    ap.add_argument("--runs", type=int, default=2, help="runs an arm, interleaved")
    ap.add_argument("--wheels", help="folder with transformers (>= 5.24), soundfile, cffi, pycparser wheels")
    ap.add_argument("--work", default="/tmp/qwen3_asr_bench_work")
    ap.add_argument("--budget-s", type=float, default=270, help="no new run starts after this many seconds")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    ap.add_argument("--table", nargs="+", help="print the table of these results.jsonl files (no run)")
    args = ap.parse_args()
    if args.table:
        print(table([json.loads(x) for f in args.table for x in Path(f).read_text().splitlines() if x.strip()]))
    elif args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
    else:
        driver(args)


if __name__ == "__main__":
    main()
