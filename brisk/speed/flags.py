"""The process-wide torch settings of a run, entered around everything that picks kernels and restored after it.

train.deterministic: cuDNN's deterministic convolution algorithms (torch.backends.cudnn.deterministic). torch's
default lets cuDNN pick a convolution backward that sums in a varying order, so two identical backward passes can
differ in the last bits: measured on an H100, Qwen3-ASR's audio-tower conv2d2/conv2d3 gradients differed by up
to 6e-11 between two passes over one batch (bench/determinism.py), and a rerun's losses by up to 4.8e-7 by step
60. With it a rerun, a resume and a run from a warm compile cache compute the same numbers.

speed.tf32: TF32 for fp32 matmuls and convolutions (the SANM encoder and adaptor when they run in fp32).
Process-wide: torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 and the float32
matmul precision are set for the duration of ``tf32_scope`` (the whole training run) and restored after it.
The bf16 LLM is unaffected. Numerical effect: fp32 matmuls keep a 10-bit mantissa on their inputs.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def backend_flags() -> dict:
    """Every torch flag a speed switch could touch: the regression tests compare this before and after."""
    b = torch.backends
    return {
        "matmul.allow_tf32": b.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": b.cudnn.allow_tf32,
        "cudnn.benchmark": b.cudnn.benchmark,
        "cudnn.deterministic": b.cudnn.deterministic,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "sdp.flash": b.cuda.flash_sdp_enabled(),
        "sdp.mem_efficient": b.cuda.mem_efficient_sdp_enabled(),
        "sdp.math": b.cuda.math_sdp_enabled(),
        "sdp.cudnn": b.cuda.cudnn_sdp_enabled(),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


@contextmanager
def tf32_scope(enabled: bool):
    if not enabled:
        yield
        return
    b = torch.backends
    saved = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    b.cuda.matmul.allow_tf32 = True
    b.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])


@contextmanager
def cudnn_deterministic(enabled: bool):
    saved = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = enabled or saved
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic = saved


@contextmanager
def run_scope(cfg):
    """Every process-wide setting the run's config asks for, entered around everything that picks kernels:
    eager steps, validation, and the warm-up and capture of every CUDA graph (a graph keeps the kernels chosen
    at capture, so a flag set only around the replays would not reach it). All are restored on exit.

    - train.deterministic: cuDNN's deterministic convolution algorithms;
    - speed.tf32: TF32 matmuls and convolutions for fp32 work;
    - speed.sdpa_backends: ``sdpa_kernel`` with exactly those backends;
    - speed.compile with compile_on_error=warn: Dynamo falls back to eager where compiling fails
      (``suppress_errors``), with its own warning;
    - speed.compile with compile_dynamic=false: a static decoder-layer graph a row length, so Dynamo's
      ``recompile_limit`` (8 graphs a function, past which it runs the layer eagerly) is raised to room for every
      speed.pack_buckets length and 8 longer ones (rows past the largest bucket).
    """
    from contextlib import ExitStack

    speed = cfg.speed
    with ExitStack() as stack:
        stack.enter_context(cudnn_deterministic(cfg.train.deterministic))
        stack.enter_context(tf32_scope(speed.tf32))
        if speed.sdpa_backends:
            from .sdpa import sdpa_scope

            stack.enter_context(sdpa_scope(speed.sdpa_backends))
        if speed.compile:
            import torch._dynamo

            dynamo = {"suppress_errors": True} if speed.compile_on_error == "warn" else {}
            if speed.compile_dynamic is False:
                dynamo["recompile_limit"] = max(torch._dynamo.config.recompile_limit, len(speed.pack_buckets) + 8)
            stack.enter_context(torch._dynamo.config.patch(**dynamo))
        yield
