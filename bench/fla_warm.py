"""Compile and autotune fla's Gated DeltaNet kernels for given value-head counts before a timed run, one process
per head count, in parallel (a cold Triton cache takes minutes a head count, one CPU core each).

    python bench/fla_warm.py 32 48       # Qwen3.5 9B and 27B

Each process runs fla's chunk_gated_delta_rule (through brisk's launcher where fla refuses the backward, as
speed.fla_kernels does) and its varlen causal_conv1d, forward and backward, bf16, on one packed row of mixed
conversation lengths with K = V = 128: the calls brisk's fla path makes. The compiled kernels land in Triton's
cache (TRITON_CACHE_DIR), which the later processes of the same machine read. Nothing is checked here: the
kernel check (bench/gdn_check.py) does that.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def warm(heads: int) -> None:
    import torch

    from brisk.diagnose import gdn_check as G
    from brisk.speed import fla_hopper

    fla_hopper.register_launcher()
    shape = G.Shape(f"warm_h{heads}", heads, 128, 128, G.MIXED)
    x = G.make_inputs(shape, "cuda")
    t0 = time.time()
    G.grads(G.fla_delta_rule(shape), {n: x[n] for n in ("q", "k", "v", "g", "beta")}, x["do"])
    G.grads(G.fla_conv(shape), {n: x[n] for n in ("x", "weight")}, x["dy"])
    torch.cuda.synchronize()
    print(f"fla warm, {heads} value heads: {time.time() - t0:.1f} s", flush=True)


def main() -> None:
    heads = [int(h) for h in sys.argv[1:]]
    if len(heads) == 1:
        return warm(heads[0])
    procs = [subprocess.Popen([sys.executable, __file__, str(h)]) for h in heads]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
