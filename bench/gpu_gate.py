#!/usr/bin/env python3
"""The GPU gate: every shipped preset of every model family, run twice in fresh processes that share one compile
cache (cold, then warm). Each run must exit 0 and the warm run must give the cold run's losses.

A run is `python -m brisk train <config> speed.preset=fast ...` as a user starts it. The table gives, per run,
its exit code, its wall time (FAILED with the exit code where it did not exit 0: never a time), its step count and
the largest difference between the cold and the warm run's logged losses. The gate passes only when every run
exits 0 and every warm run's losses equal the cold run's within --tol (exactly, by default).

    python bench/gpu_gate.py --out bench/tmp/gate                   # all runs (GPU)
    python bench/gpu_gate.py --out bench/tmp/gate --only nano_real  # one run pair

The runs (names for --only):
- nano_real: Fun-ASR-Nano at real size (a random folder from tools/make_nano_folder.py, --nano) on the whole-run
  espeak-ng set (--data), 1 epoch with validation and a checkpoint; the preset as shipped.
- nano_demo: configs/demo.yaml on the GPU with the preset.
- chat_qwen3 / chat_qwen3_5: configs/sft_demo.yaml on the GPU with the preset, Qwen3 and a small Qwen3.5 (fla's
  kernels where fla is installed).
- asr_frozen / asr_demo: configs/qwen3_asr_demo.yaml on the GPU with the preset, the audio tower frozen (the
  preset's graphed path) and as shipped (tower training). Needs a transformers with qwen3_asr (--asr-pythonpath
  prepends a folder holding one).
Writes gate.md and gate.json to --out, and each run's output, metrics.jsonl and steps.jsonl under --out/logs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QWEN3_5 = ("model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 512, intermediate_size: 1024, "
           "num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, "
           "linear_num_key_heads: 16, linear_num_value_heads: 16, linear_key_head_dim: 128, "
           "linear_value_head_dim: 128, linear_conv_kernel_dim: 4, tie_word_embeddings: false, "
           "layer_types: [linear_attention, full_attention, linear_attention, full_attention]}")
COMMON = ["train.device=cuda", "speed.preset=fast", "train.progress=false", "train.tensorboard=false"]


def runs(a) -> dict[str, list[str]]:
    data = Path(a.data).resolve()
    return {
        "nano_real": ["configs/fun_asr_nano.yaml", f"model.path={Path(a.nano).resolve()}",
                      f"data.train={data / 'train.jsonl'}", f"data.valid={data / 'valid.jsonl'}", "train.max_epochs=1",
                      "train.max_steps=0", "train.log_every=1"],
        "nano_demo": ["configs/demo.yaml", "train.max_steps=60", "train.log_every=1", "train.val_every=30"],
        "chat_qwen3": ["configs/sft_demo.yaml", "train.max_steps=40", "train.log_every=1"],
        "chat_qwen3_5": ["configs/sft_demo.yaml", QWEN3_5, "model.llm.dtype=bf16", "train.max_steps=40",
                         "train.log_every=1"],
        "asr_frozen": ["configs/qwen3_asr_demo.yaml", "model.encoder.freeze=true", "model.adaptor.freeze=true",
                       "train.max_steps=60", "train.log_every=1", "train.val_decode=8"],
        "asr_demo": ["configs/qwen3_asr_demo.yaml", "train.max_steps=60", "train.log_every=1", "train.val_decode=8"],
    }


def losses(run_dir: Path) -> dict[int, float]:
    path = run_dir / "metrics.jsonl"  # one line a step: its loss, acc, grad_norm, lr
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if "loss" in rec and "step" in rec:
            out[int(rec["step"])] = float(rec["loss"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/gate")
    ap.add_argument("--work", default="/tmp/brisk_gate", help="run folders and the one compile cache")
    ap.add_argument("--nano", default="/tmp/nano", help="a real-size Fun-ASR-Nano folder (tools/make_nano_folder.py)")
    ap.add_argument("--data", default=str(REPO / "bench" / "tmp" / "wholerun_data"))
    ap.add_argument("--only", default="", help="comma-separated run names (default: all)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per run")
    ap.add_argument("--tol", type=float, default=0.0, help="largest |cold - warm| loss difference that passes")
    ap.add_argument("--asr-pythonpath", default="", help="prepended to PYTHONPATH for the asr_* runs")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for every run (e.g. TORCH_LOGS=recompiles)")
    a = ap.parse_args()
    out, work = Path(a.out).resolve(), Path(a.work).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    cache = work / "compile_cache"
    shutil.rmtree(cache, ignore_errors=True)  # cold means cold
    base_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": str(cache),
                "TRITON_CACHE_DIR": str(cache / "triton")}
    base_env.update(dict(kv.split("=", 1) for kv in a.env))
    todo = runs(a)
    names = [n for n in todo if not a.only or n in a.only.split(",")]
    rows, ok = [], True
    for name in names:
        env = dict(base_env)
        if name.startswith("asr") and a.asr_pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([a.asr_pythonpath, env.get("PYTHONPATH", "")])
        result = {"run": name}
        for arm in ("cold", "warm"):
            run_dir = work / f"{name}_{arm}"
            shutil.rmtree(run_dir, ignore_errors=True)
            cmd = [sys.executable, "-m", "brisk", "train", *todo[name], *COMMON, f"train.output_dir={run_dir}",
                   f"speed.inductor_cache_dir={cache}"]
            log = out / "logs" / f"{name}_{arm}.log"
            t0 = time.time()
            with log.open("w") as f:
                f.write(" ".join(cmd) + "\n")
                f.flush()
                try:
                    rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                        timeout=a.timeout).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            result[arm] = {"rc": rc, "seconds": round(time.time() - t0, 1), "losses": losses(run_dir)}
            for kept in ("metrics.jsonl", "steps.jsonl"):
                if (run_dir / kept).exists():
                    shutil.copy(run_dir / kept, out / "logs" / f"{name}_{arm}.{kept}")
            print(f"gate: {name} {arm}: rc {rc}, {result[arm]['seconds']} s, {len(result[arm]['losses'])} losses",
                  flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints and exports: GBs at real size
        cold, warm = result["cold"]["losses"], result["warm"]["losses"]
        common = sorted(set(cold) & set(warm))
        diff = max((abs(cold[s] - warm[s]) for s in common), default=float("nan"))
        same_steps = bool(common) and set(cold) == set(warm)
        passed = (result["cold"]["rc"] == 0 and result["warm"]["rc"] == 0 and same_steps and diff <= a.tol)
        result.update(max_loss_diff=diff, steps=len(common), passed=passed)
        ok &= passed
        rows.append(result)

    def cell(r):
        return f"{r['seconds']:.1f} s" if r["rc"] == 0 else f"FAILED (exit {r['rc']})"

    lines = ["| run | cold | warm | logged steps | largest loss difference | gate |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {cell(r['cold'])} | {cell(r['warm'])} | {r['steps']} | "
                     f"{r['max_loss_diff']:.3g} | {'met' if r['passed'] else 'UNMET'} |")
    md = "\n".join(lines)
    meta = {"date": datetime.now().isoformat(timespec="seconds"), "argv": sys.argv[1:], "tol": a.tol}
    try:
        import torch
        meta.update(torch=torch.__version__, gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    except Exception:  # pragma: no cover
        pass
    (out / "gate.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (out / "gate.md").write_text(f"# GPU gate\n\n{json.dumps(meta)}\n\n{md}\n\n{'PASSED' if ok else 'FAILED'}\n")
    print(md)
    print("gate:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
