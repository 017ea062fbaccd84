"""What `brisk bench` and `brisk profile` share: a fixed batch stream and a training step built from a config.

The stream is a list of sample groups taken once from the configured data (the demo jsonl, a FunASR jsonl,
or a length profile with random features), so every arm trains on the same utterances in the same order;
each arm collates them its own way (padded, packed, static buckets).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from ..config import Config
from ..data.collate import collator_for
from ..data.loader import build_split
from ..distributed.ranks import pick_device
from ..speed.flags import run_scope
from ..train.assemble import Parts, Ranks, assemble, step_function, step_hooks, train_step
from ..train.threads import pick_threads
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
    """The decoder's vocabulary (of a multimodal config too: its text config's), from the config the model is
    built from."""
    from ..models.build import llm_hf_config

    return int(llm_hf_config(cfg.model.llm).get_text_config().vocab_size)


@dataclass
class Runner:
    """One arm: the run's parts (assembled as `brisk train` assembles them) and its step function."""

    parts: Parts
    step: object  # the step function: TrainStep, or a GraphedStep around it
    hooks: StepHooks
    setup_seconds: float

    cfg = property(lambda self: self.parts.cfg)
    device = property(lambda self: self.parts.device)
    model = property(lambda self: self.parts.model)

    def collate(self, samples: list) -> object:
        return self.parts.collator(samples)

    def batches(self, stream: list) -> list:
        """The stream's batches in pinned memory on CUDA, as DataLoader(pin_memory=True) delivers them to the
        trainer: a copy from pageable memory would make the host wait for the step before it (bench, profile)."""
        out = [self.collate(s) for s in stream]
        return [b.pin_memory() for b in out] if self.device.type == "cuda" else out

    def run(self, batch) -> dict:
        with run_scope(self.cfg):
            return self.step([batch.to(self.device, non_blocking=True)])


def build_runner(cfg: Config, mark=None, graph_capture: str | None = "ahead") -> Runner:
    """``mark``: the phase-mark callback of the caller's step timer (bench times phases; profile does not).
    ``graph_capture``: the bench, the profile and the batch-size search capture every bucket's graphs before the
    first step (``ahead``), so that no capture or compile lands in what they time or in the memory they measure
    (the preset's ``seen`` would capture at a bucket's first batch); None keeps the config's own."""
    if graph_capture is not None and cfg.speed.graph_capture != graph_capture:
        cfg = dataclasses.replace(cfg, speed=dataclasses.replace(cfg.speed, graph_capture=graph_capture))
    t0 = time.perf_counter()
    device = pick_device(cfg.train.device)
    pick_threads(cfg, device)  # train.cpu_threads, as `brisk train` sets it
    parts = assemble(cfg, Ranks(device))
    parts.accel.train_mode()
    hooks = step_hooks(parts, **({"mark": mark} if mark is not None else {}))
    step = step_function(parts, train_step(parts, hooks))
    sync(parts.device)
    return Runner(parts, step, hooks, time.perf_counter() - t0)


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

    from ..speed.flex import varlen_for_counting

    model, hooks = runner.model, runner.hooks
    total = 0.0
    for b in batches:
        b = b.to(runner.device)
        with run_scope(runner.cfg), varlen_for_counting(getattr(model, "llm", model)), \
                FlopCounterMode(display=False) as fc:
            _, loss, _, _ = model_loss(model, b, hooks)
            loss.backward()
        total += fc.get_total_flops()
        model.zero_grad(set_to_none=True)
    return total / max(len(batches), 1)


def flops_str(x: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} FLOP"

