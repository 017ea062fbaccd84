#!/usr/bin/env python3
"""Data at users' scale on the CPU: time to the first training step, peak RSS and cache size, cold and warm.

Arms (each a fresh process; "cold" empties its cache first, "warm" runs again on what cold left):

    brisk-chat    brisk train, configs/sft_demo.yaml's tiny Qwen3, on an ultrachat_200k-layout folder (split train_sft)
    brisk-speech  brisk train, configs/demo.yaml's tiny speech-LLM, on a FunASR jsonl
    trl           TRL's SFTTrainer: load_dataset("parquet") + its data preparation + one training step
    rate          brisk's steady loading rate (chat: the cached store through the collator; speech: audio + fbank)

    python bench/data_bench.py brisk-chat --data /tmp/uc/ultrachat_200k --out bench/tmp/data
    python bench/data_bench.py trl --data '/tmp/uc/ultrachat_200k/data/train_sft-00000-*.parquet' --num-proc 2
    python bench/data_bench.py brisk-speech --data /tmp/speech_1m.jsonl
    python bench/data_bench.py rate --data /tmp/uc/ultrachat_200k --chat

Time to the first step is measured from launching the process to its log line for step 1 (brisk, log_every=1)
or to TRL's first on_step_end; peak RSS is the largest resident set of the process or any process it forked
(getrusage of the waited children). One JSON line per arm goes to --out/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def du(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_child(argv: list[str], marker: str, env: dict | None = None, log: Path | None = None) -> dict:
    """Run argv; seconds until a stdout line holding ``marker``, total seconds, peak RSS (MB) of the tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    first = [None]
    lines: list[str] = []
    marks: dict[str, float] = {}  # when the data's first line and the loop's first line arrived

    def read():
        for line in proc.stdout:
            now = time.perf_counter() - t0
            lines.append(line)
            if first[0] is None and marker in line:
                first[0] = now
            for name, text in (("data_start_s", "data.train ("), ("loop_start_s", "training from step")):
                if name not in marks and text in line:
                    marks[name] = round(now, 2)

    th = threading.Thread(target=read)
    th.start()
    rc = proc.wait()
    th.join()
    total = time.perf_counter() - t0
    if log is not None:
        log.write_text("".join(lines))
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if rc != 0:
        sys.stdout.write("".join(lines[-30:]))
        raise SystemExit(f"{argv[:4]} failed with {rc}")
    # ru_maxrss of children is the largest of any waited child so far: run each arm in its own bench process
    # for an exact figure (this script is called once per arm and mode).
    return {"first_step_s": round(first[0], 2) if first[0] else None, "total_s": round(total, 2),
            "peak_rss_mb": round(max(peak, before) / 1024), "lines": lines, **marks}


def brisk(args, config: str, overrides: list[str], run: Path) -> dict:
    argv = [sys.executable, "-m", "brisk", "train", config, *overrides, f"train.output_dir={run}",
            "train.overwrite=true", "train.max_steps=1", "train.log_every=1", "train.export=none",
            "train.save_final=false", "data.valid=null"]
    out = run_child(argv, "step 1", log=run.parent / f"{run.name}.{args.mode}.log")
    out["data_lines"] = [line.strip() for line in out.pop("lines") if "data." in line or "conversations" in line
                         or "utterances" in line or "audio" in line][:12]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arm", choices=("brisk-chat", "brisk-speech", "trl", "rate"))
    ap.add_argument("--data", required=True)
    ap.add_argument("--mode", choices=("cold", "warm"), default="cold")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "tmp" / "data")
    ap.add_argument("--max-len", type=int, default=1024, help="TRL's default max_length; brisk's causal_lm.max_len")
    ap.add_argument("--num-proc", type=int, default=None, help="trl: dataset_num_proc (default: TRL's, None)")
    ap.add_argument("--split", default="train_sft", help="brisk-chat, rate: data.train_split ('' for none)")
    ap.add_argument("--chat", action="store_true", help="rate: the chat store (else the speech list)")
    ap.add_argument("--seconds", type=float, default=20.0, help="rate: how long to read")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.out / "runs"
    cache = runs / ".brisk-cache"
    row = {"arm": args.arm, "mode": args.mode, "data": args.data, "date": time.strftime("%Y-%m-%d %H:%M")}
    if args.arm == "brisk-chat":
        if args.mode == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        row |= brisk(args, "configs/sft_demo.yaml", [
            f"data.train={args.data}", f"data.train_split={args.split or 'null'}", f"causal_lm.max_len={args.max_len}",
            "data.batch_tokens=8192", "data.num_workers=1", "model.llm.config.max_position_embeddings=4096"],
            runs / "chat")
        row["cache_mb"] = round(du(cache) / 2**20)
    elif args.arm == "brisk-speech":
        if args.mode == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        row |= brisk(args, "configs/demo.yaml", [f"data.train={args.data}", "data.num_workers=1"], runs / "speech")
        row["cache_mb"] = round(du(cache) / 2**20)
    elif args.arm == "trl":
        hf = args.out / "hf_datasets_cache"
        if args.mode == "cold":
            shutil.rmtree(hf, ignore_errors=True)
        out = run_child([sys.executable, str(Path(__file__).resolve()), "_trl", args.data, str(args.max_len),
                         str(args.num_proc or 0)], "first step", env={"HF_DATASETS_CACHE": str(hf)},
                        log=args.out / f"trl.{args.mode}.{args.num_proc or 0}.log")
        out["detail"] = [json.loads(line) for line in out.pop("lines") if line.startswith('{"')]
        row |= out | {"num_proc": args.num_proc, "cache_mb": round(du(hf) / 2**20)}
    else:
        row |= rate(args)
    print(json.dumps(row))
    with (args.out / "results.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")


def trl_child(data: str, max_len: int, num_proc: int) -> None:
    """TRL 1.16 as its users run it: parquet loaded with datasets, SFTTrainer with assistant-only loss (the labels
    brisk builds) and its other defaults, one training step on a tiny Qwen3."""
    t0 = time.perf_counter()
    import datasets
    import trl
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    t_import = time.perf_counter() - t0
    files = sorted(str(p) for p in Path("/").glob(data.lstrip("/"))) if "*" in data else [data]
    ds = datasets.load_dataset("parquet", data_files=files, split="train")
    # ultrachat's string 'prompt' column sends TRL down its prompt/completion path; its users drop it
    ds = ds.remove_columns([c for c in ("prompt", "prompt_id") if c in ds.column_names])
    t_load = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(str(ROOT / "data" / "chat_demo" / "tokenizer"), local_files_only=True)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "qwen3", vocab_size=392, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=4096))
    cfg = trl.SFTConfig(output_dir=str(Path(os.environ["HF_DATASETS_CACHE"]).parent / "trl_out"),
                        assistant_only_loss=True, max_length=max_len, report_to=[], use_cpu=True, max_steps=1,
                        per_device_train_batch_size=8, save_strategy="no", logging_steps=1,
                        dataset_num_proc=num_proc or None)

    class First(TrainerCallback):
        def on_step_end(self, *a, **k):
            print(json.dumps({"first_step_at_s": round(time.perf_counter() - t0, 2)}), flush=True)
            print("first step", flush=True)

    trainer = trl.SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[First()])
    t_prep = time.perf_counter() - t0
    print(json.dumps({"import_s": round(t_import, 2), "loaded_s": round(t_load, 2), "prepared_s": round(t_prep, 2),
                      "rows": len(ds), "kept": len(trainer.train_dataset)}), flush=True)
    trainer.train()


def rate(args) -> dict:
    """Batches a second from brisk's loader, without a model, after a warm-up; the data set comes from the cache
    the cold/warm arms left (or is built now)."""
    sys.path.insert(0, str(ROOT))
    from brisk.config import load_config
    from brisk.data.collate import Collator
    from brisk.data.loader import build_split

    if args.chat:
        cfg = load_config(ROOT / "configs" / "sft_demo.yaml", [
            f"data.train={args.data}", f"data.train_split={args.split or 'null'}", f"causal_lm.max_len={args.max_len}",
            "data.batch_tokens=8192", "data.num_workers=1", "data.valid=null", f"train.output_dir={args.out / 'runs' / 'chat'}"])
        collator = Collator(packed=True, token_buckets=(8192,))
    else:
        cfg = load_config(ROOT / "configs" / "demo.yaml", [f"data.train={args.data}", "data.num_workers=1",
                                                            "data.valid=null", f"train.output_dir={args.out / 'runs' / 'speech'}"])
        from brisk.data.collate import collator_for

        collator = collator_for(cfg)
    split = build_split(cfg, "train", collator, vocab_size=392)

    def batches():
        epoch = 0
        while True:
            split.sampler.set_epoch(epoch)
            yield from split.loader
            epoch += 1

    it = batches()
    for _ in range(5):
        next(it)
    n = utts = tokens = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        b = next(it)
        n += 1
        utts += int(b.cu_seqlens.numel() - 1) if getattr(b, "cu_seqlens", None) is not None else b.input_ids.shape[0]
        tokens += int(b.n_tokens)
    dt = time.perf_counter() - t0
    split.close()
    return {"batches_s": round(n / dt, 1), "utts_s": round(utts / dt, 1), "tokens_s": round(tokens / dt),
            "num_workers": cfg.data.num_workers, "batch_tokens": cfg.data.batch_tokens}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_trl":
        trl_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
