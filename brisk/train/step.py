"""One training step: forward, loss, backward, clipping, update. Metrics stay on the device.

Speed switches and diagnostics reach the step only through ``StepHooks``: a context around forward and
backward (the SDPA backend scope), a provider of precomputed audio rows (frozen or cached encoder), phase
marks for the timer, and a callback between backward and the update for the probe.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from ..data.batch import Batch
from ..models.speech_llm import lm_loss
from .optim import WarmupLR, clip_grads, trainable_params, update


def _no_mark(name: str) -> None:
    return None


@dataclass
class StepHooks:
    mark: Callable[[str], None] = _no_mark  # phase ends: "forward", "backward", "optimizer"
    context: Callable[[], ContextManager] = nullcontext  # around forward and backward
    audio: Callable[[Batch], torch.Tensor | None] | None = None  # precomputed audio rows
    on_grads: list[Callable[[], None]] = field(default_factory=list)  # after backward, before the update
    logit_stats: bool = False  # logits abs-mean and std (fp32) for the probe


def model_loss(model, batch: Batch, hooks: StepHooks, rows: torch.Tensor | None = None):
    """Forward and loss as every path runs them (training, graphs, validation, FLOP counting): audio rows from
    the frozen provider unless given, model and loss inside the step's attention scope.
    Returns (logits, loss, correct, count)."""
    if rows is None and hooks.audio is not None:
        rows = hooks.audio(batch)
    with hooks.context():
        logits = model(batch, audio_rows=rows)
        loss, correct, count = lm_loss(logits, batch.labels)
    return logits, loss, correct, count


def logit_stats(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """abs-mean and std (fp32) of the logits at labelled positions (what the loss sees)."""
    with torch.no_grad():
        # Masked sums instead of boolean indexing: indexing would need the count on the host (a sync).
        lf = logits[:, :-1].float()
        m = (labels[:, 1:] != -100).unsqueeze(-1).to(lf.dtype)
        n = m.sum() * lf.shape[-1]
        mean = (lf * m).sum() / n
        var = ((lf - mean).pow(2) * m).sum() / (n - 1)
        return (lf.abs() * m).sum() / n, var.sqrt()


class TrainStep:
    def __init__(self, model, optimizer: torch.optim.Optimizer, schedule: WarmupLR, *, grad_clip: float,
                 on_device_skip: bool = False, hooks: StepHooks | None = None):
        self.model, self.optimizer, self.schedule = model, optimizer, schedule
        self.grad_clip = grad_clip
        self.on_device_skip = on_device_skip
        self.hooks = hooks or StepHooks()
        self.params = trainable_params(model)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = self.hooks
        logits, loss, correct, count = model_loss(self.model, batch, h)
        out = {"loss": loss.detach(), "correct": correct, "count": count}
        if h.logit_stats:
            out["logits_absmean"], out["logits_std"] = logit_stats(logits, batch.labels)
        return loss, out

    def __call__(self, batches: list[Batch]) -> dict[str, torch.Tensor]:
        h = self.hooks
        metrics: dict[str, torch.Tensor] = {}
        for batch in batches:  # gradient accumulation: FunASR scales each micro-batch loss by 1/accum
            loss, out = self.forward(batch)
            h.mark("forward")
            with h.context():
                (loss / len(batches)).backward()
            h.mark("backward")
            for k, v in out.items():
                metrics[k] = metrics[k] + v if k in metrics else v
        if len(batches) > 1:
            for k in ("loss", "logits_absmean", "logits_std"):
                if k in metrics:
                    metrics[k] = metrics[k] / len(batches)
        norm = clip_grads(self.params, self.grad_clip)
        for fn in h.on_grads:
            fn()
        metrics["grad_norm"] = norm.detach()
        metrics["skipped"] = update(self.optimizer, self.schedule, norm, on_device=self.on_device_skip)
        self.optimizer.zero_grad(set_to_none=True)
        h.mark("optimizer")
        return metrics
