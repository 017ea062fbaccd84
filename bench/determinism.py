#!/usr/bin/env python3
"""Which gradients differ between two identical backward passes (GPU): a config's run parts built as `brisk train`
builds them, one batch, forward and backward twice from the same weights, every trainable parameter's gradient
compared bit for bit: with torch's default settings, under cuDNN's deterministic algorithms (what
train.deterministic sets), and under
torch.use_deterministic_algorithms (warn_only: each nondeterministic op it meets is named).

    python bench/determinism.py configs/qwen3_asr_demo.yaml train.device=cuda speed.preset=fast

Prints one table per mode: the parameters whose gradients differed, their largest difference, and the ops torch
named.
"""

from __future__ import annotations

import sys
import warnings
from contextlib import contextmanager

import torch


@contextmanager
def mode(name: str):
    cudnn, algos = torch.backends.cudnn.deterministic, torch.are_deterministic_algorithms_enabled()
    try:
        torch.backends.cudnn.deterministic = name != "default"  # default: torch's own setting
        if name == "torch":
            torch.use_deterministic_algorithms(True, warn_only=True)
        yield
    finally:
        torch.backends.cudnn.deterministic = cudnn
        torch.use_deterministic_algorithms(algos)


def grads(runner, batch) -> dict[str, torch.Tensor]:
    from brisk.train.step import model_loss

    model = runner.model
    for p in model.parameters():
        p.grad = None
    _, loss, _, _ = model_loss(model, batch, runner.hooks)
    loss.backward()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def main() -> int:
    from brisk.bench.harness import build_runner, sample_stream, llm_vocab
    from brisk.config import load_config
    from brisk.speed.flags import run_scope

    cfg = load_config(sys.argv[1], sys.argv[2:] + ["speed.cuda_graph=false", "data.num_workers=0"])
    runner = build_runner(cfg, graph_capture=None)
    batch = runner.collate(sample_stream(cfg, 1, llm_vocab(cfg))[0]).to(runner.device)
    with run_scope(cfg):
        grads(runner, batch)  # compiles, autotunes
        for name in ("default", "cudnn", "torch"):
            with mode(name), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                a, b = grads(runner, batch), grads(runner, batch)
            differ = {k: (a[k].float() - b[k].float()).abs().max().item() for k in a if not torch.equal(a[k], b[k])}
            ops = sorted({str(w.message).split("\n")[0][:160] for w in caught if "determinis" in str(w.message)})
            print(f"\n## {name}: {len(differ)} of {len(a)} gradients differ")
            for k, v in sorted(differ.items(), key=lambda kv: -kv[1])[:25]:
                print(f"| {k} | {v:.3g} |")
            for op in ops:
                print("op:", op)
    return 0


if __name__ == "__main__":
    sys.exit(main())
