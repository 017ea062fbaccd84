#!/usr/bin/env python3
"""Does torch's precompile cache cut a warm start's Dynamo tracing? A CPU experiment (no GPU needed).

A tiny Qwen3 decoder (transformers) with each layer compiled at static shapes, as brisk's static-layer preset
compiles them, meets N sequence lengths once each (forward + backward). Three fresh processes share one Inductor
cache folder: cold (empty cache), warm (the on-disk FX/AOT caches only), warm_precompile (also
torch._dynamo.config.caching_precompile with save/load_cache_artifacts). Each prints the seconds of every first
call and their sum.

    python bench/warm_start_cpu.py --out bench/tmp/warm_start   # runs the three arms, a table last
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def child(arm: str, cache: Path, lengths: list[int]) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    artifacts = cache / "artifacts.bin"
    if arm == "warm_precompile":
        torch._dynamo.config.caching_precompile = True
        if artifacts.exists():
            t = time.perf_counter()
            torch.compiler.load_cache_artifacts(artifacts.read_bytes())
            load_s = time.perf_counter() - t
    elif arm == "cold_precompile":
        torch._dynamo.config.caching_precompile = True
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(cfg)
    from brisk.models.kernel_router import without_kernel_router

    without_kernel_router(model)  # as brisk builds it: the hub-kernel router's wrapper off (transformers >= 5.25)
    for layer in model.model.layers:
        layer.compile(dynamic=False)
    firsts = []
    for n in lengths:
        ids = torch.randint(0, 512, (1, n))
        t = time.perf_counter()
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        firsts.append(round(time.perf_counter() - t, 3))
    if arm.endswith("precompile") and arm.startswith("cold"):
        got = torch.compiler.save_cache_artifacts()
        if got is not None:
            artifacts.write_bytes(got[0])
    res = {"arm": arm, "firsts": firsts, "total_s": round(sum(firsts), 2), "loss": float(out.loss)}
    if arm == "warm_precompile" and artifacts.exists():
        res["load_s"] = round(load_s, 3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/tmp/warm_start")
    ap.add_argument("--lengths", default="256,384,512,640,768")
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    out = Path(a.out)
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.child:
        print(json.dumps(child(a.child, out / "cache", lengths)))
        return
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for arms in (("cold", "warm"), ("cold_precompile", "warm_precompile")):
        shutil.rmtree(out / "cache", ignore_errors=True)
        (out / "cache").mkdir()
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(out / "cache")}
        for arm in arms:
            t = time.perf_counter()
            r = subprocess.run([sys.executable, __file__, "--out", str(out), "--lengths", a.lengths, "--child", arm],
                               capture_output=True, text=True, env=env)
            wall = round(time.perf_counter() - t, 1)
            res = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"arm": arm, "error": r.stderr[-800:]}
            res["process_s"] = wall
            rows.append(res)
            print(json.dumps(res), flush=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print("| arm | first calls, s each | sum s | process s | loss |\n|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['arm']} | FAILED | | {r['process_s']} | |")
        else:
            print(f"| {r['arm']} | {', '.join(map(str, r['firsts']))} | {r['total_s']} | {r['process_s']} | {r['loss']:.6f} |")


if __name__ == "__main__":
    main()
