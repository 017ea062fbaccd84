"""`brisk profile CONFIG --steps N`: where a steady step's time goes.

torch.profiler over N steps after a warm-up: the top operations by CPU time and by GPU time (calls, average,
total), device time a step by kernel class (matmul, attention, optimizer, Inductor fusions, ...), kernel
launches a step, the fraction of the profiled wall time the GPU was busy (union of kernel intervals), the
roofline fraction, and a one-line verdict: host-bound (the GPU waits on launches) or
device-bound. Writes profile.md and a Chrome/Perfetto trace (trace.json; open it in ui.perfetto.dev).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path


from ..config import Config
from .harness import build_runner, count_flops, flops_str, llm_vocab, matmul_rate, sample_stream, sync

log = logging.getLogger("brisk")

LAUNCH_NAMES = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch",
                "cudaLaunchCooperativeKernel"}


def is_kernel(e) -> bool:
    return str(getattr(e, "device_type", "")).endswith("CUDA") and not e.name.startswith(("Memcpy", "Memset"))


def launch_counts(events, steps: int) -> dict:
    """Host launch calls (a graph replay is one) and device kernels, per step."""
    n = max(steps, 1)
    return {"launches": sum(1 for e in events if e.name in LAUNCH_NAMES) / n,
            "kernels": sum(1 for e in events if is_kernel(e)) / n}


# Kernel classes by name, first match wins: what a step's device time is made of. Inside a CUDA graph the
# profiler sees kernels but not the operations that launched them, so names are what is left to go by.
KERNEL_CLASSES = [
    ("attention (FlexAttention, Inductor's template)", r"^triton_.*flex"),  # speed.flex_attention
    ("compiled (Triton, fused by Inductor)", r"^triton_"),  # named after the ops inside: before the op classes
    ("communication (NCCL)", r"nccl"),
    ("optimizer and norms (multi-tensor)", r"multi_tensor_apply|foreach|fused_adam"),
    ("attention (flash / cuDNN / efficient)", r"flash|fmha|cudnn.*(sdpa|fmha|flash|attn)|attention|sdpa"),
    ("matmul (nvjet / cuBLAS / CUTLASS)", r"nvjet|gemm|cutlass|sm90_xmma|ampere_|cublas"),
    ("depthwise conv (encoder FSMN)", r"conv_depthwise|depthwise"),
    ("softmax / cross-entropy", r"softmax|cross_entropy|nll_loss|log_softmax"),
    ("elementwise add (residuals, gradient accumulation)", r"CUDAFunctor_add|AddFunctor"),
    ("copies and casts", r"copy|_cast|cast_"),
    ("reductions and norms", r"reduce|norm|sum_|mean"),
    ("indexing (embedding, gather, scatter)", r"index|gather|scatter|embedding"),
]


def kernel_class(name: str) -> str:
    for label, pattern in KERNEL_CLASSES:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return label
    return "other"


def kernel_classes(events, steps: int) -> list[tuple[str, float, float]]:
    """(class, kernels a step, device ms a step), largest first."""
    n, count, ms = max(steps, 1), {}, {}
    for e in events:
        if is_kernel(e):
            c = kernel_class(e.name)
            count[c] = count.get(c, 0) + 1
            ms[c] = ms.get(c, 0.0) + (e.time_range.end - e.time_range.start) / 1000.0
    return sorted(((c, count[c] / n, ms[c] / n) for c in count), key=lambda r: -r[2])


def _class_table(rows: list[tuple[str, float, float]]) -> list[str]:
    total = sum(r[2] for r in rows) or 1.0
    out = ["### Device time a step by kernel class", "", "| class | kernels a step | ms a step | share | us a kernel |",
           "|---|---|---|---|---|"]
    for c, k, ms in rows:
        out.append(f"| {c} | {k:.1f} | {ms:.2f} | {ms / total:.0%} | {1000 * ms / max(k, 1e-9):.1f} |")
    return out + [f"| all | {sum(r[1] for r in rows):.1f} | {total:.2f} | | |", ""]


def _table(rows: list, title: str, key: str) -> list[str]:
    out = [f"### {title}", "", "| operation | calls | avg us | total ms |", "|---|---|---|---|"]
    for e in rows:
        total = getattr(e, key) / 1000.0
        out.append(f"| `{e.key[:80]}` | {e.count} | {getattr(e, key) / max(e.count, 1):.1f} | {total:.2f} |")
    return out + [""]


SHORT_GAP_US = 5.0  # an idle gap shorter than this is the device's own kernel-to-kernel latency (in a graph)


def device_timeline(events, steps: int) -> dict:
    """The union of device kernel intervals against the device span (first kernel start to last kernel end),
    and the idle gaps between them a step: short ones (< SHORT_GAP_US, one kernel following another inside a
    graph: what fewer kernels would save) and long ones (the device waiting for the host: a launch, a copy, a
    sync). Measured on the device timeline rather than the host's wall clock, so the profiler's own start-up
    and the final synchronisation do not count as idle time."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if is_kernel(e) and e.time_range.end > e.time_range.start)
    merged: list[list[float]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
    short = [g for g in gaps if g < SHORT_GAP_US]
    span = merged[-1][1] - merged[0][0] if merged else 0.0
    n = max(steps, 1)
    return {"busy": sum(e - s for s, e in merged) / span if span else 0.0,
            "short_gaps": len(short) / n, "short_ms": sum(short) / 1000 / n,
            "long_gaps": (len(gaps) - len(short)) / n, "long_ms": (sum(gaps) - sum(short)) / 1000 / n}


def run_profile(cfg: Config, steps: int = 3, warmup: int = 5, out: Path | None = None) -> str:
    from torch.profiler import ProfilerActivity, profile

    from .quiet import without_profiler_chatter

    out = out or Path(cfg.train.output_dir) / "profile"
    stream = sample_stream(cfg, warmup + steps, llm_vocab(cfg))
    runner = build_runner(cfg)
    batches = runner.batches(stream)
    for b in batches[:warmup]:
        runner.run(b)
    sync(runner.device)
    cuda = runner.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with without_profiler_chatter(), profile(activities=acts) as prof:
        sync(runner.device)
        t0 = time.perf_counter()
        for b in batches[warmup:]:
            runner.run(b)
        sync(runner.device)
        wall = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)  # made at the first write: a refused profile leaves no folder
    prof.export_chrome_trace(str(out / "trace.json"))
    events = prof.events()
    counts = launch_counts(events, steps)
    launches, kernels = counts["launches"], counts["kernels"]
    timeline = device_timeline(events, steps) if cuda else {"busy": 1.0}
    busy = timeline["busy"]
    flops = count_flops(runner, batches[warmup:])
    rate, rate_what = matmul_rate(runner.device)
    step_s = wall / steps
    roof = flops / step_s / rate
    if cuda:
        verdict = ("host-bound: the GPU is idle {:.0%} of the step, waiting for launches".format(1 - busy) if busy < 0.6
                   else "device-bound: the GPU is busy {:.0%} of the step; faster kernels or less work will help".format(busy))
    else:
        verdict = "CPU run: everything is host time"
    ka = prof.key_averages()
    lines = [f"# Profile of {steps} steady steps", "",
             f"- step time {step_s * 1000:.1f} ms with the profiler on (it slows the host), kernel launches a step "
             f"{launches:.0f}, device kernels a step {kernels:.0f}",
             f"- GPU busy {busy:.0%} of its timeline from the first kernel to the last" if cuda else "- no GPU",
             *([f"- idle a step: {timeline['short_ms']:.2f} ms in {timeline['short_gaps']:.0f} gaps under "
                f"{SHORT_GAP_US:.0f} us (kernel to kernel), {timeline['long_ms']:.2f} ms in {timeline['long_gaps']:.0f} "
                "longer ones (the device waiting for the host)"] if cuda else []),
             f"- model FLOPs a step {flops_str(flops)}; roofline {roof:.1%} of {flops_str(rate)}/s ({rate_what}, measured)",
             f"- verdict: {verdict}", "", f"Trace: {out / 'trace.json'} (open in https://ui.perfetto.dev)", ""]
    lines += _table(sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[:20], "Top operations by CPU time (self)", "self_cpu_time_total")
    if cuda:
        lines += _class_table(kernel_classes(events, steps))
        lines += _table(sorted(ka, key=lambda e: e.self_device_time_total, reverse=True)[:20], "Top operations by GPU time (self)", "self_device_time_total")
    text = "\n".join(lines) + "\n"
    (out / "profile.md").write_text(text, encoding="utf-8")
    print(text)
    return text
