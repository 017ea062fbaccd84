#!/usr/bin/env python3
"""Qwen3-ASR greedy decoding: transformers' ``generate`` as its users call it against brisk's decoders, on the same
model, the same utterances, the same prompt, in one process.

    python bench/qwen3_asr_decode_bench.py --out $OUT                        # GPU: random 0.6B sizes, bf16
    python bench/qwen3_asr_decode_bench.py --size tiny --device cpu --utts 4 --max-new 4 --batches 1,2   # smoke

The model is brisk's, random (``--size``: bench/configs/bench_qwen3_asr_0p6b.yaml, or the demo's tiny config),
exported with ``train.export=hf`` and loaded back by transformers (Qwen3ASRForConditionalGeneration, the bundled
processor), so both sides hold the same weights. The utterances: the first ``--utts`` of the bundled speech set.
At most ``--max-new`` new tokens: a random model rarely stops, so every row runs to the cap in every arm.

Arms (each at every ``--batches`` size; each fast arm warmed on the very batches it times, so its captures and
compiles are reported, not timed; generate and plain warmed on their first batch):
  generate      transformers: the processor on each batch's audio and prompt text (left padding), then
                ``model.generate(do_sample=False)``: what a user of transformers runs
  plain         brisk's Recognizer: its features and prompt, the tower's rows spliced in, the decoder's ``generate``
  fast          ``--fast``: the same prompt embeddings, a static KV cache, the decode step a CUDA graph a batch
                bucket and span (brisk.eval.fast_decode.FastGreedy)
  fast_multi    ``--fast-multi-step``: several tokens a graph replay
  fast_compile  ``--fast-compile``: the step compiled by Inductor before capture

Per arm and batch: utterances/s of the whole transcribe (audio reading, features, tower, decode), RTF, and the
ratio to ``generate`` at the same batch. The ids of every arm are compared with ``generate``'s: in fp32 they must
be equal; in bf16 a differing utterance is reported with brisk plain's top-1 minus top-2 logit at the first
differing token (bench/decode_bench.py's measure of a near-tie). Writes decode.json and decode.md to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = {"0p6b": "bench/configs/bench_qwen3_asr_0p6b.yaml", "tiny": "configs/qwen3_asr_demo.yaml"}
ARMS = ("generate", "plain", "fast", "fast_multi", "fast_compile")


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def batched(items: list, n: int) -> list[list]:
    return [items[i:i + n] for i in range(0, len(items), n)]


def hf_arm(hf, processor, rec, paths: list[str], batch: int, max_new: int, device: str) -> tuple[list[list[int]], float]:
    """transformers' way: the processor on each batch (audio read as the recognizer reads it), then generate."""
    import torch

    from brisk.data.audio import read_audio

    msgs = [{"role": "system", "content": ""}, {"role": "user", "content": [{"type": "audio", "audio": None}]}]
    prompt = processor.apply_chat_template([msgs], add_generation_prompt=True, tokenize=False)[0] + rec.prefill
    ids = []

    def one(group):
        waves = [read_audio(p, rec.fs).numpy() for p in group]
        inputs = processor(text=[prompt] * len(group), audio=waves, return_tensors="pt", padding=True).to(device)
        if "input_features" in inputs:
            inputs["input_features"] = inputs["input_features"].to(hf.dtype)
        with torch.no_grad():
            out = hf.generate(**inputs, max_new_tokens=max_new, do_sample=False)
        return out[:, inputs["input_ids"].shape[1]:].tolist()

    one(paths[:batch])  # first-call work (cuBLAS handles, kernel loads) outside the timed pass, as for every arm
    sync(device)
    t0 = time.perf_counter()
    for group in batched(paths, batch):
        for row in one(group):
            ids.append(row[:next((j for j, x in enumerate(row) if x in rec.stop), len(row))])
    sync(device)
    return ids, time.perf_counter() - t0


def brisk_arm(name: str, cfg, model, device: str, paths: list[str], batch: int, max_new: int, margins_of=None):
    """(ids, seconds of the timed pass, seconds of the warm-up pass, plain's margins or None)."""
    from brisk.eval.decode import timed_transcribe
    from brisk.eval.evaluate import recognizer

    kw = {"fast": name != "plain", "fast_multi_step": name == "fast_multi",
          "fast_compile": "inductor" if name == "fast_compile" else None}
    rec = recognizer(cfg, model, None, device, max_new_tokens=max_new, **kw)
    # a fast arm: every bucket's capture (and compile) in a pass of its own, not timed; plain: its first batch
    warm = timed_transcribe(rec, paths if name != "plain" else paths[:batch], batch, max_new)[1]
    margins = margins_of(rec.model.llm) if margins_of is not None else None
    results, seconds = timed_transcribe(rec, paths, batch, max_new)
    rows = None
    if margins is not None:
        margins.remove()
        rows = margins.rows()
    rec.release()
    return [r.ids for r in results], seconds, warm, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench/tmp/qwen3_asr_decode"))
    ap.add_argument("--size", default="0p6b", choices=sorted(SIZES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--utts", type=int, default=64)
    ap.add_argument("--slow-utts", type=int, default=16, help="utterances of generate and plain at batch 1")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--dtype", default=None, help="the model's dtype (default: bf16 on CUDA, fp32 on the CPU)")
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    import torch
    import transformers
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    from brisk.config import load_config
    from brisk.families import family_of
    from brisk.models.export import export_folder
    from decode_bench import Margins, agreement_lines, divergence

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = a.dtype or ("bf16" if a.device.startswith("cuda") else "fp32")
    cfg = load_config(REPO / SIZES[a.size], [f"train.device={a.device}", f"model.llm.dtype={dtype}",
                                             f"train.output_dir={out / 'run'}", "data.num_workers=0"])
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = family_of(cfg).build(cfg, a.device).eval()
    folder = export_folder(model, cfg, out / "hf", fmt="hf", dtype=dtype)
    hf = Qwen3ASRForConditionalGeneration.from_pretrained(
        folder, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32).to(a.device).eval()
    processor = AutoProcessor.from_pretrained(folder)
    processor.tokenizer.padding_side = "left"  # batched generation
    setup = time.perf_counter() - t0
    _, paths, _ = family_of(cfg).eval_set(cfg.data.valid or cfg.data.train, cfg)
    paths = (paths * (a.utts // max(len(paths), 1) + 1))[: a.utts]
    from brisk.eval.evaluate import recognizer

    probe = recognizer(cfg, model, None, a.device, max_new_tokens=a.max_new)  # the prompt's forced language, stops
    rows = []
    for batch in [int(b) for b in a.batches.split(",")]:
        for arm in a.arms.split(","):
            n = a.slow_utts if batch == 1 and arm in ("generate", "plain") else len(paths)
            row = {"arm": arm, "batch": batch, "utterances": n}
            try:
                if arm == "generate":
                    ids, seconds = hf_arm(hf, processor, probe, paths[:n], batch, a.max_new, a.device)
                    warm, margins = 0.0, None
                else:
                    ids, seconds, warm, margins = brisk_arm(arm, cfg, model, a.device, paths[:n], batch, a.max_new,
                                                            Margins if arm == "plain" else None)
                row.update(seconds=seconds, utts_per_s=n / seconds, warmup_s=warm, ids=ids,
                           tokens=sum(len(x) for x in ids), **({"margins": margins} if margins else {}))
            except Exception as e:  # one FAILED row, not a crash of the bench
                row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("ids", "margins")}), flush=True)
    agree = {}
    for r in rows:
        ref = next((g for g in rows if g["arm"] == "generate" and g["batch"] == r["batch"] and "ids" in g), None)
        plain = next((p for p in rows if p["arm"] == "plain" and p["batch"] == r["batch"] and "margins" in p), None)
        if r["arm"] != "generate" and ref is not None and "ids" in r:
            k = min(len(ref["ids"]), len(r["ids"]))
            base = {"ids": ref["ids"][:k], **({"margins": plain["margins"]} if plain else {})}
            agree[f"{r['arm']} b{r['batch']} vs generate"] = divergence(base, r["ids"][:k])
    meta = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu", "dtype": dtype,
            "torch": torch.__version__, "transformers": transformers.__version__, "size": a.size,
            "max_new": a.max_new, "setup_s": setup, "command": " ".join(sys.argv)}
    text = table(rows, meta) + "\n\nIds against generate:\n" + "\n".join(agreement_lines(agree)) + "\n"
    (out / "decode.md").write_text(text, encoding="utf-8")
    (out / "decode.json").write_text(json.dumps({"meta": meta, "rows": rows, "agreement": agree}), encoding="utf-8")
    print("\n" + text)
    return 0 if all("error" not in r for r in rows) else 1


def table(rows: list[dict], meta: dict) -> str:
    lines = [f"Qwen3-ASR greedy decoding ({meta['size']} sizes, random weights, {meta['dtype']}), at most "
             f"{meta['max_new']} new tokens, {meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}",
             "", "| arm | batch | utterances | utts/s | vs generate | tokens | warm-up s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['arm']} | {r['batch']} | {r['utterances']} | FAILED: {r['error'][:80]} | | | |")
            continue
        ref = next((g for g in rows if g["arm"] == "generate" and g["batch"] == r["batch"] and "utts_per_s" in g), None)
        ratio = f"{r['utts_per_s'] / ref['utts_per_s']:.2f}x" if ref else "-"
        lines.append(f"| {r['arm']} | {r['batch']} | {r['utterances']} | {r['utts_per_s']:.2f} | {ratio} | "
                     f"{r['tokens']} | {r['warmup_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
