#!/usr/bin/env python3
"""Issue 35, item 3: the attention kernels at the speech step's size, forward + backward, one decoder layer.

FunASR's workload packs ~10 utterances of ~160 LLM tokens into one row of the 1,792-token bucket (1,595 real
tokens, configs/bench_levers35.yaml); Qwen3-0.6B's attention has 16 query heads, 8 KV heads of 128, bf16.
The arms:

- varlen: brisk's packed path as the preset runs it (brisk.speed.varlen: torch's varlen_attn, FlashAttention-2,
  the KV heads repeated where torch's kernel has no GQA), on the packed row;
- SDPA flash / efficient / cuDNN on the same sequences as a padded batch [utterances, heads, L, 128] with a
  causal mask (exact for right-padded rows), L the longest sequence and, for cuDNN, also L rounded up to a
  fixed bucket (a multiple of 256) (cuDNN builds an execution plan per new shape: fixed buckets keep that to
  one; the warm-up steps pay it here);
- each padded arm twice: the kernel alone, and with the gather from the packed row and the scatter back that
  the packed model would need around it.

- FlexAttention (compiled) on the packed row itself with a document-causal block mask and GQA (no gather, no
  repeated KV heads): with the mask built once, and with the mask built in every call (as a training step with
  new sequence lengths would).

Reports three times an arm, each also x 28 layers: the median of CUDA-event timed forward + backward calls
(eager: host launches included, as an eager step pays them); the sum of the kernels' own durations from the
profiler (a lower bound: the gaps between kernels are not counted); the median of CUDA-graph replays of the
captured call (gaps included, and one graph launch a layer where the preset pays one a step: close to what a
graphed step pays; an arm that cannot be captured says why; round 10 ran without this column). And each
arm's largest output difference from varlen on the real tokens (bf16).

    python bench/attention35.py --out /tmp/attn35          # CUDA; writes attention35.md / .json, prints the table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brisk.speed.varlen import varlen_attention  # noqa: E402

H, HKV, D, LAYERS = 16, 8, 128, 28


def lengths(total: int, n: int, bucket: int, seed: int) -> list[int]:
    """n sequence lengths summing to total (about total / n each, +-30%), then the bucket's padding as one more."""
    g = torch.Generator().manual_seed(seed)
    w = 0.7 + 0.6 * torch.rand(n, generator=g)
    out = [int(x) for x in (w / w.sum() * total).round()]
    out[-1] += total - sum(out)
    return out + ([bucket - total] if bucket > total else [])


def timed(fn, warmup: int, reps: int, cuda: bool) -> float:
    """Median seconds of one call: CUDA events (the CPU smoke run: the wall clock)."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if not cuda:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def device_ms(fn, reps: int) -> float:
    """Milliseconds of GPU kernel time a call: the profiler's kernel records summed over reps calls, divided."""
    from torch.profiler import ProfilerActivity, profile
    from torch.autograd import DeviceType

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return us / 1e3 / reps


def graphed_ms(fn, reps: int) -> float:
    """Median milliseconds of one CUDA-graph replay of the call (forward + backward captured once): what a
    graphed step pays, gaps between kernels included, launches not. Raises where the call cannot be captured
    (a host sync inside it, such as a block mask built from host values)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch's docs ask
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph, inner = torch.cuda.CUDAGraph(), None
    try:
        with torch.cuda.graph(graph):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - the cause; capture_end's own error would hide it
                inner = e
                raise
    except Exception as e:  # noqa: BLE001
        raise inner or e
    return timed(graph.replay, warmup=3, reps=reps, cuda=True) * 1e3


def flex_arms(q, k, v, g_out, lens, scale, dev):
    """FlexAttention on the packed row: one document id a sequence (the bucket's padding its own), causal inside
    each; GQA by the kernel. Returns (mask built once, mask built every call)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))
    T = doc.numel()

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    flex = torch.compile(flex_attention, dynamic=False)
    once = create_block_mask(mask_mod, 1, 1, T, T, device=dev)
    g = g_out.transpose(1, 2)  # [1, H, T, D], flex's layout

    def run(block_mask):
        q.grad = k.grad = v.grad = None
        out = flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)
        out.backward(g)
        return out.transpose(1, 2)  # [1, T, H, D], varlen's layout

    return (lambda: run(once)), (lambda: run(create_block_mask(mask_mod, 1, 1, T, T, device=dev)))


def brisk_flex_arms(q, k, v, g_out, cu, scale):
    """speed.flex_attention as the training step runs it: brisk's block mask built from cu_seqlens in the call
    (``brisk.speed.flex.document_block_mask``) inside a function compiled with dynamic shapes (the layers'
    speed.compile_dynamic=true), the FlexAttention call broken out to its own static compile (``static_flex``,
    round 12); and round 11's two arms for comparison, the call inline (``flex``) compiled dynamic and static."""
    from brisk.speed.flex import MASK_KEY, document_block_mask, flex, flex_attention_fn

    T = q.shape[2]

    def step(q, k, v):
        return flex_attention_fn(None, q, k, v, None, scaling=scale, **{MASK_KEY: document_block_mask(cu, T)})[0]

    def inline(q, k, v):
        return flex(q, k, v, document_block_mask(cu, T), scale).transpose(1, 2)

    def arm(fn):
        def run():
            q.grad = k.grad = v.grad = None
            out = fn(q, k, v)
            out.backward(g_out)
            return out
        return run

    return {"brisk flex_attention: mask from cu_seqlens, dynamic layer, static_flex call": arm(torch.compile(step, dynamic=True)),
            "FlexAttention inline, mask from cu_seqlens in the call, dynamic (round 11's switch)": arm(torch.compile(inline, dynamic=True)),
            "FlexAttention inline, mask from cu_seqlens in the call, static": arm(torch.compile(inline, dynamic=False))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/attention35")
    ap.add_argument("--tokens", type=int, default=1595)
    ap.add_argument("--utts", type=int, default=10)
    ap.add_argument("--bucket", type=int, default=1792)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--flex-only", action="store_true", help="varlen and the FlexAttention arms only")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only checks that the script runs (no SDPA kernels)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("attention35: needs CUDA")
    dev, dt, cuda = torch.device(a.device), torch.bfloat16, a.device == "cuda"
    lens = lengths(a.tokens, a.utts, a.bucket, seed=35)
    real = lens[: a.utts]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    T = sum(lens)
    torch.manual_seed(0)
    q = torch.randn(1, H, T, D, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(1, HKV, T, D, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(1, HKV, T, D, device=dev, dtype=dt, requires_grad=True)
    g_out = torch.randn(1, T, H, D, device=dev, dtype=dt)
    scale = D ** -0.5

    def varlen():
        q.grad = k.grad = v.grad = None
        out, _ = varlen_attention(None, q, k, v, None, scaling=scale, cu_seq_lens_q=cu)
        out.backward(g_out)
        return out

    # padded layout: [B, H, L, D]; index of each real token of the packed row in the flattened [B * L]
    starts = cu[: a.utts].tolist()
    pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, real)]).to(dev)

    def padded_io(L: int):
        slot = torch.cat([torch.arange(i * L, i * L + n) for i, n in enumerate(real)]).to(dev)

        def to_padded(x):  # [1, h, T, D] -> [B, h, L, D]
            h = x.shape[1]
            buf = x.new_zeros(len(real) * L, h, D)
            buf[slot] = x[0].transpose(0, 1)[pos]
            return buf.view(len(real), L, h, D).transpose(1, 2)

        def from_padded(o):  # [B, H, L, D] -> the real tokens [n_real, H, D]
            return o.transpose(1, 2).reshape(len(real) * L, H, D)[slot]

        return to_padded, from_padded, slot

    maxlen = max(real)
    arms = {"varlen (the preset's path)": (varlen, None)}
    ref = varlen().detach()[0][pos].float()  # [n_real, H, D]
    q.grad = k.grad = v.grad = None
    results = {}
    fixed = -(-maxlen // 256) * 256
    sdpa = (("SDPA flash", SDPBackend.FLASH_ATTENTION, maxlen),
            ("SDPA efficient", SDPBackend.EFFICIENT_ATTENTION, maxlen),
            ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION, maxlen),
            ("SDPA cuDNN, fixed bucket", SDPBackend.CUDNN_ATTENTION, fixed))
    for name, backend, L in (() if a.flex_only else sdpa):
        to_p, from_p, slot = padded_io(L)
        qp0, kp0, vp0 = (to_p(x).detach().contiguous().requires_grad_() for x in (q, k, v))
        kr0, vr0 = (x.repeat_interleave(H // HKV, dim=1).detach().contiguous().requires_grad_() for x in (kp0, vp0))
        gp = torch.zeros(len(real) * L, H, D, device=dev, dtype=dt)
        gp[slot] = g_out[0][pos]
        gp = gp.view(len(real), L, H, D).transpose(1, 2).contiguous()

        def kernel(backend=backend, qp0=qp0, kr0=kr0, vr0=vr0, gp=gp):
            qp0.grad = kr0.grad = vr0.grad = None
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(qp0, kr0, vr0, is_causal=True, scale=scale)
            o.backward(gp)
            return o

        def with_copies(backend=backend, to_p=to_p, from_p=from_p):
            q.grad = k.grad = v.grad = None
            qp, kp, vp = to_p(q), to_p(k), to_p(v)
            kp, vp = kp.repeat_interleave(H // HKV, dim=1), vp.repeat_interleave(H // HKV, dim=1)
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale)
            out = from_p(o)
            out.backward(g_out[0][pos])
            return o

        try:
            o = kernel()
            diff = float((from_p(o.detach()).float() - ref).abs().max())
            arms[f"{name}, L {L}: kernel"] = (kernel, diff)
            arms[f"{name}, L {L}: + gather / scatter"] = (with_copies, diff)
        except RuntimeError as e:  # a backend that does not take these shapes on this build
            results[f"{name}, L {L}"] = {"error": str(e).splitlines()[0][:160]}
    if cuda:  # Inductor's flex kernels are Triton: the CPU smoke run stops at the SDPA arms' errors
        try:
            once, each = flex_arms(q, k, v, g_out, lens, scale, dev)
            diff = float((once().detach()[0][pos].float() - ref).abs().max())
            arms["FlexAttention on the packed row, mask built once"] = (once, diff)
            for name, fn in brisk_flex_arms(q, k, v, g_out, cu, scale).items():
                arms[name] = (fn, float((fn().detach()[0][pos].float() - ref).abs().max()))
            arms["FlexAttention on the packed row, mask built every call"] = (each, diff)
        except Exception as e:  # noqa: BLE001 - a compile failure on this build is a result to report
            results["FlexAttention on the packed row"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:140]}"}
        q.grad = k.grad = v.grad = None
    for name, (fn, diff) in arms.items():
        try:
            s = timed(fn, warmup=5, reps=a.reps, cuda=cuda)
            dev_ms = device_ms(fn, reps=10) if cuda else None
            results[name] = {"ms": s * 1e3, "ms_28_layers": s * 1e3 * LAYERS, "device_ms": dev_ms, "max_diff": diff}
        except RuntimeError as e:
            results[name] = {"error": str(e).splitlines()[0][:160]}
        q.grad = k.grad = v.grad = None
    # Graph replays last, the preset's path and FlexAttention's first, the mask built in the call (which may not
    # capture) at the end: a failed capture can leave the stream and the caching allocator in capture state,
    # so no capture is tried after one fails.
    order = sorted((n for n in arms if "error" not in results.get(n, {"error": 1})),
                   key=lambda n: (not n.startswith("varlen"), "mask built once" not in n, "every call" in n))
    failed = None
    for name in order if cuda else []:
        if failed:
            results[name]["graph_error"] = f"not tried after {failed}'s capture failed"
            continue
        try:
            results[name]["graph_ms"] = graphed_ms(arms[name][0], reps=a.reps)
        except Exception as e:  # noqa: BLE001 - "cannot be captured" is the answer for that arm
            failed = name
            results[name]["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        q.grad = k.grad = v.grad = None
    results = dict(sorted(results.items(), key=lambda kv: not kv[0].startswith("varlen")))  # varlen first
    out = Path(a.out)  # the figures on disk before the table is made from them
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention35.json").write_text(json.dumps({"lengths": lens, "results": results}, indent=1))
    base = results["varlen (the preset's path)"].get("ms")
    lines = [f"One decoder layer's attention, forward + backward, bf16, {H} query / {HKV} KV heads of {D}: "
             f"{a.utts} sequences ({min(real)}-{maxlen} tokens, {sum(real)} in all) packed in a {a.bucket}-token "
             f"row; median of {a.reps} timed calls. torch {torch.__version__}, "
             f"{torch.cuda.get_device_name() if cuda else 'CPU (a smoke run: no timing worth reading)'}.", "",
             "| arm | eager ms a layer | x 28 layers ms | vs varlen | kernels' device ms a layer | x 28 layers ms "
             "| vs varlen | graph replay ms a layer | x 28 layers ms | vs varlen | max diff from varlen (real tokens) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cols(r, key, ref):
        v = r.get(key)
        if not v:
            why = r.get("graph_error") if key == "graph_ms" else None
            return f"not captured: {why} | | " if why else "- | - | -"
        return f"{v:.3f} | {v * LAYERS:.2f} | " + (f"{ref / v:.2f}x" if ref else "-")

    ref_row = results["varlen (the preset's path)"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | not run: {r['error']} | | | | | | | | | |")
            continue
        d = "-" if r["max_diff"] is None else f"{r['max_diff']:.3g}"
        lines.append(f"| {name} | {r['ms']:.3f} | {r['ms_28_layers']:.2f} | {base / r['ms']:.2f}x | "
                     f"{cols(r, 'device_ms', ref_row.get('device_ms'))} | {cols(r, 'graph_ms', ref_row.get('graph_ms'))} | {d} |")
    table = "\n".join(lines) + "\n"
    (out / "attention35.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
