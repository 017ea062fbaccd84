"""What `brisk bench` and `brisk profile` share: a fixed batch stream and a training step built from a config.

The stream is a list of sample groups taken once from the configured data (the demo jsonl, a FunASR jsonl,
or a length profile with random features), so every arm trains on the same utterances in the same order;
each arm collates them its own way (padded, packed, static buckets).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..config import Config
from ..data.loader import build_split
from ..models.build import build_model
from ..speed import apply_speed, collator_for
from ..speed.flags import tf32_scope
from ..train.run import build_step, graph_step, pick_device
from ..train.step import StepHooks, model_loss


def sample_stream(cfg: Config, n: int, vocab: int) -> list[list]:
    """The first ``n`` batches (as lists of samples) of epoch 0, cycling if the data is shorter."""
    split = build_split(cfg, "train", collator_for(cfg), vocab)
    batches = split.sampler.batches(0)
    if not batches:
        raise ValueError("the data gives no batches")
    out = []
    while len(out) < n:
        for idx in batches[: n - len(out)]:
            out.append([split.dataset[(i, 0)] for i in idx])
    return out


def llm_vocab(cfg: Config) -> int:
    if cfg.model.llm.path:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(cfg.model.llm.path, local_files_only=True).vocab_size
    return int(cfg.model.llm.config["vocab_size"])


@dataclass
class Runner:
    cfg: Config
    device: torch.device
    model: torch.nn.Module
    step: object
    collator: object
    setup_seconds: float
    hooks: StepHooks

    def collate(self, samples: list) -> object:
        return self.collator(samples)

    def run(self, batch) -> dict:
        with tf32_scope(self.cfg.speed.tf32):
            return self.step([batch.to(self.device, non_blocking=True)])


def build_runner(cfg: Config) -> Runner:
    t0 = time.perf_counter()
    device = pick_device(cfg.train.device)
    model = build_model(cfg.model, device, task=cfg.task)
    torch.manual_seed(cfg.train.seed)
    model.train()
    plan = apply_speed(model, cfg, device)
    _, _, step = build_step(cfg, model, plan)
    hooks = step.hooks
    if cfg.speed.cuda_graph:
        step = graph_step(cfg, step, plan, device)
    sync(device)
    return Runner(cfg, device, model, step, plan.collator, time.perf_counter() - t0, hooks)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_rate(device: torch.device) -> tuple[float, str]:
    """Measured dense matmul rate (FLOP/s): bf16 8192^3 on a GPU, fp32 1024^3 on the CPU."""
    if device.type == "cuda":
        n, dtype, reps = 8192, torch.bfloat16, 10
    else:
        n, dtype, reps = 1024, torch.float32, 5
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    rate = 2 * n**3 * reps / (time.perf_counter() - t0)
    return rate, f"{'bf16' if dtype == torch.bfloat16 else 'fp32'} {n}^3 matmul"


def count_flops(runner: Runner, batches: list) -> float:
    """Model FLOPs of forward + backward (torch's FlopCounterMode), mean over ``batches``; nothing is updated."""
    from torch.utils.flop_counter import FlopCounterMode

    model, hooks = runner.model, runner.hooks
    total = 0.0
    for b in batches:
        b = b.to(runner.device)
        with FlopCounterMode(display=False) as fc:
            _, loss, _, _ = model_loss(model, b, hooks)
            with hooks.context():
                loss.backward()
        total += fc.get_total_flops()
        model.zero_grad(set_to_none=True)
    return total / max(len(batches), 1)
