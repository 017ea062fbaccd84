"""fla's chunked gated delta rule with fp32 inputs against the fp64 per-token recurrence (issue 30, round 9).

Round 9's GPU test put an fp32 Qwen3.5 model with fla against transformers' torch chunk function for the first
time: the loss agreed, dt_bias's gradient was 3.2 relative off (bf16 passed its bound against the same
reference). dt_bias's gradient is the sum of fla's dg, which comes out of the gated ``chunk_bwd_dqkwg`` that
fla refuses on Hopper with Triton 3.4-3.7.0 (issue 640: wrong dk / dg at one key-block width, found in bf16).
This prints each output's and gradient's relative error, at the test model's head shape (K = 128, V = 64) and
Qwen3.5's (K = V = 128), for fp32 inputs at fla's width and at forced widths 32 / 64 / 128, for bf16 inputs,
and for transformers' torch chunk function in fp32 (the floor). Run it once more with TRITON_F32_DEFAULT=ieee:
if fp32's error is TF32 rounding amplified, it falls there; a miscompile does not.

    python bench/fla_fp32_check.py            # one GPU, fla on the path
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brisk.diagnose import gdn_check as G  # noqa: E402
from brisk.speed import fla_hopper  # noqa: E402

TENSORS = ("o", "dq", "dk", "dv", "dg", "dbeta")
SHAPES = (G.Shape("test_model_k128_v64", 4, 128, 64, (5, 64, 130, 300, 37), conv=0),
          G.Shape("qwen3_5_2b_short", 16, 128, 128, (17, 63, 200, 511), conv=0))


def main() -> None:
    fla_hopper.register_launcher()
    print(f"TRITON_F32_DEFAULT={os.environ.get('TRITON_F32_DEFAULT', '(unset: tf32)')}, "
          f"{torch.cuda.get_device_name()}, triton {fla_hopper.triton_version()}")
    print("| shape | arm | " + " | ".join(TENSORS) + " |")
    print("|---|---|" + "---|" * len(TENSORS))
    for shape in SHAPES:
        inputs = G.make_inputs(shape, "cuda")
        leaves32 = {n: inputs[n].float() for n in ("q", "k", "v", "g", "beta")}
        do32 = inputs["do"].float()
        ref = G.grads(lambda **x: G.varlen_reference(**x, lengths=shape.lengths, dtype=torch.float64),
                      leaves32, do32.double())
        run = G.fla_delta_rule(shape)
        arms = {"torch chunk fp32": lambda: G.grads(
            lambda **x: G.torch_chunk_varlen(**x, lengths=shape.lengths), leaves32, do32)}
        arms["fla fp32, brisk's width"] = lambda: G.grads(run, leaves32, do32)
        for bk in (32, 64, 128):
            def forced(bk=bk):
                with fla_hopper.forced_block_width(bk):
                    return G.grads(run, leaves32, do32)
            arms[f"fla fp32, BK {bk} forced"] = forced
        leaves16 = {n: inputs[n] for n in ("q", "k", "v", "g", "beta")}
        arms["fla bf16, brisk's width"] = lambda: G.grads(run, leaves16, inputs["do"])
        for name, fn in arms.items():
            try:
                fn()  # compiles and autotunes
                got = fn()
                cells = [f"{G.errors(got[t], ref[t])[1]:.2e}" for t in TENSORS]
            except Exception as e:  # noqa: BLE001 - a refused width is a row, not the end of the table
                cells = [f"{type(e).__name__}: {str(e)[:60]}"] + [""] * (len(TENSORS) - 1)
            print(f"| {shape.name} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
