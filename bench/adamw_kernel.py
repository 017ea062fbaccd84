"""speed.triton_adamw against torch's fused AdamW on the tensors of Qwen3-0.6B (Fun-ASR-Nano's decoder), bf16
parameters and moments as the speech preset trains them, clip scale and found_inf set as the graphed step sets
them. Prints, for each arm: the bits against torch's kernel after 3 steps, and the update's time inside a CUDA
graph (median of 50 replays) with the bytes it moves a step.

    python bench/adamw_kernel.py [--out bench.md]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from brisk.speed import triton_adamw
from brisk.speed.triton_adamw import TritonAdamW


def qwen3_06b_shapes() -> list[tuple[int, ...]]:
    h, inter, q, kv, layers, vocab = 1024, 3072, 2048, 1024, 28, 151936
    per_layer = [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter), (h,), (h,), (128,), (128,)]
    return [(vocab, h)] + per_layer * layers + [(h,)]


def build(cls, shapes, seed=0, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=dtype) * 0.02) for s in shapes]
    opt = cls(ps, lr=torch.tensor(2e-4, device="cuda"), betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
              fused=True, capturable=True)
    return ps, opt


def set_grads(ps, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, device="cuda", dtype=p.dtype, generator=g) * 1e-3


def step(opt, scale, found):
    opt.grad_scale, opt.found_inf = scale, found
    opt.step()
    del opt.grad_scale, opt.found_inf


def differing(ref_opt, ref_ps, opt, ps) -> dict[str, int]:
    out = {"param": 0, "exp_avg": 0, "exp_avg_sq": 0}
    for a, b in zip(ref_ps, ps):
        out["param"] += int((a != b).sum())
        for k in ("exp_avg", "exp_avg_sq"):
            out[k] += int((ref_opt.state[a][k] != opt.state[b][k]).sum())
    return out


def graph_time(opt, ps, scale, found, reps=50) -> float:
    step(opt, scale, found)
    opt.grad_scale, opt.found_inf = scale, found
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        opt.step()
    torch.cuda.current_stream().wait_stream(side)
    del opt.grad_scale, opt.found_inf
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    shapes = qwen3_06b_shapes()
    n = sum(torch.Size(s).numel() for s in shapes)
    scale, found = torch.tensor(1.7, device="cuda"), torch.zeros((), device="cuda")
    rows = []
    for dtype, sh in ((torch.bfloat16, shapes), (torch.float32, shapes[1:34])):  # fp32: 3 layers, every bit shows
        ref_ps, ref = build(torch.optim.AdamW, sh, dtype=dtype)
        for k in range(3):
            set_grads(ref_ps, k)
            step(ref, scale, found)
        ps, opt = build(TritonAdamW, sh, dtype=dtype)
        for k in range(3):
            set_grads(ps, k)
            step(opt, scale, found)
        rows.append((f"{str(dtype)[6:]}, {len(sh)} tensors", differing(ref, ref_ps, opt, ps)))
        del ps, opt
        del ref_ps, ref
        torch.cuda.empty_cache()
    times = {}
    for name, cls, block, warps in (("torch fused", torch.optim.AdamW, 0, 0), ("triton 4096 x 8 warps", TritonAdamW, 4096, 8),
                                    ("triton 8192 x 16 warps (default)", TritonAdamW, 8192, 16),
                                    ("triton 16384 x 16 warps", TritonAdamW, 16384, 16)):
        if block:
            triton_adamw.BLOCK, triton_adamw.NUM_WARPS = block, warps
        ps, opt = build(cls, shapes)
        set_grads(ps, 0)
        times[name] = graph_time(opt, ps, scale, found)
        del ps, opt
        torch.cuda.empty_cache()
    bf16 = 2
    moved = {k: n * bf16 * (8 if k == "torch fused" else 7) for k in times}  # torch writes the gradients back
    lines = [f"# AdamW update on Qwen3-0.6B's {len(shapes)} tensors ({n / 1e6:.1f}M bf16 elements), "
             f"{torch.cuda.get_device_name()}, torch {torch.__version__}", "",
             "| dtype, tensors | elements differing from torch's kernel after 3 steps (param / exp_avg / exp_avg_sq) |", "|---|---|"]
    lines += [f"| {name} | {d['param']} / {d['exp_avg']} / {d['exp_avg_sq']} |" for name, d in rows]
    lines += ["", "| arm | ms a step (CUDA graph, median of 50) | GB moved | TB/s |", "|---|---|---|---|"]
    lines += [f"| {k} | {t:.3f} | {moved[k] / 1e9:.2f} | {moved[k] / t / 1e9:.2f} |" for k, t in times.items()]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
