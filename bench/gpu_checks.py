"""CUDA-only measurement of speed.compile on the GPU machine (CI has no GPU):

    python bench/gpu_checks.py [--out DIR]

How many graphs Dynamo compiled for N identical decoder layers, how long it took, and how far the compiled
graphed step is from the eager one over 8 steps. Exits 1 when the numbers are off. The other fast-path checks
(varlen attention, packed == padded, graph step == eager step, resume, export, probe, torch flags) are
pytest assertions: python -m pytest tests/gpu -q -m gpu.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brisk.bench.harness import build_runner, sample_stream, sync  # noqa: E402
from brisk.config import load_config  # noqa: E402
from brisk.speed.compile import compile_counters  # noqa: E402
from brisk.speed.flags import backend_flags  # noqa: E402
from tests.gpu.test_gpu_state import SMALL  # noqa: E402


def run_steps(overrides: list[str], n: int) -> tuple[list[float], dict, dict, float]:
    cfg = load_config(REPO / "configs/fun_asr_nano.yaml", SMALL + overrides)
    before = backend_flags()
    t0 = time.perf_counter()
    runner = build_runner(cfg)
    stream = sample_stream(cfg, n, 4096)
    losses = []
    for samples in stream:
        m = runner.run(runner.collate(samples))
        losses.append(m["loss"])
    sync(runner.device)
    elapsed = time.perf_counter() - t0
    losses = [float(x) for x in losses]
    params = {k: v.detach().float().cpu() for k, v in runner.model.named_parameters() if v.requires_grad}
    return losses, params, {"flags_unchanged": backend_flags() == before}, elapsed


def compare(a, b) -> dict:
    la, pa = a[0], a[1]
    lb, pb = b[0], b[1]
    loss_rel = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    prel = max(((pa[k] - pb[k]).norm() / pa[k].norm().clamp_min(1e-12)).item() for k in pa)
    return {"loss_max_rel": loss_rel, "param_max_rel_l2": prel}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/tmp")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    base = ["speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true"]
    eager = run_steps(base, 8)
    c0 = compile_counters()
    compiled = run_steps(base + ["speed.cuda_graph=true", "speed.compile=true"], 8)
    c1 = compile_counters()
    r = {**compare(eager, compiled), **compiled[2], "graphs_compiled": c1["graphs"] - c0["graphs"], "layers": 6,
         "seconds": compiled[3]}
    r["ok"] = r["loss_max_rel"] < 1e-3 and r["param_max_rel_l2"] < 2e-2 and r["flags_unchanged"] and r["graphs_compiled"] < 6
    results["compile_graph_vs_eager"] = r
    (out / "gpu_checks.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
