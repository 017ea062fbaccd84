"""One training step: zero, forward, loss, backward, gradient sync, norms, clipping, update. Metrics stay on the device.

``TrainStep.body`` is the only step body: the eager path calls it, and speed.cuda_graph captures the very
same call into a graph (so it never syncs with the host when the optimizer is fused, and it takes no
host callbacks). Speed switches and diagnostics reach it only through ``StepHooks``, built once when the
run is assembled: a provider of precomputed audio rows (frozen or cached encoder), a replacement for the
logits and loss (speed.label_head), phase marks for the timer, a gradient-sync slot (data parallel), the
parameter groups whose gradient norms the probe wants (computed here, before clipping, as one device vector),
and the optimizer in the backward (speed.optimizer_in_backward: the layers updated from their gradient hooks).
Process-wide flags (SDPA backends, TF32) are not the step's business: the run enters them around everything
(speed.flags.run_scope). How the body starts from no gradients is ``persistent_grads``, given by the plan:
zeroed fixed buffers under CUDA graphs, none otherwise (and under speed.fresh_grads).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..formats.batch import Batch
from ..models.lm import lm_loss
from ..speed.grad_norms import tensor_norms
from .optim import WarmupLR, trainable_params


def _no_mark(name: str) -> None:
    return None


def _no_sync(grads: list[torch.Tensor]) -> None:
    return None


@dataclass
class StepHooks:
    mark: Callable[[str], None] = _no_mark  # phase ends: "forward", "backward", "optimizer"
    audio: Callable[[Batch], torch.Tensor | None] | None = None  # precomputed audio rows
    # After backward, before any norm: make the gradients the global ones (data parallel). Must not sync
    # with the host (it runs inside CUDA graphs too). A no-op by default (DDP reduces in its own hooks).
    sync_grads: Callable[[list[torch.Tensor]], None] = _no_sync
    logit_stats: bool = False  # logits abs-mean and std (fp32) for the probe
    grad_groups: dict[int, int] | None = None  # id(parameter) -> group slot: per-group grad norms (probe)
    # Replaces model + lm_loss: (model, batch, rows, stats) -> (stats pair or None, loss, correct, count);
    # set by speed.label_head (LM head and loss on the labelled positions only). None: the model's own logits.
    loss: Callable | None = None
    # speed.optimizer_in_backward: arm() before the last backward, then tensor_norms(grads) and finish(norm)
    # in place of the optimizer's step (speed/optim_in_backward.py). None: the optimizer steps after the backward.
    in_backward: object | None = None


class StepFunction(Protocol):
    """What the loop calls one step: a ``TrainStep``, or a ``GraphedStep`` (brisk.speed.graph) replaying one. The
    loop asks it for nothing else, so a step that wraps another must answer all of it."""

    hooks: StepHooks  # the step's hooks (the wrapped step's, for a wrapper)

    def __call__(self, batches: list[Batch]) -> dict[str, torch.Tensor]: ...

    @property
    def audio(self) -> Callable[[Batch], torch.Tensor | None] | None:
        """The audio provider the step uses (validation takes the same one: graphed encoders replay there)."""

    @property
    def captures(self) -> dict[str, int]:
        """CUDA graphs captured so far, by kind (the slow-step detector's counters); none for an eager step."""

    def no_new_audio_graphs(self) -> AbstractContextManager:
        """Inside (validation): no audio graph is captured."""


def model_loss(model, batch: Batch, hooks: StepHooks, rows: torch.Tensor | None = None):
    """Forward and loss as every path runs them (training, graphs, validation, FLOP counting): audio rows from
    the frozen provider unless given.
    Returns (logits, loss, correct, count); under speed.label_head the first item is (absmean, std) or None."""
    if rows is None and hooks.audio is not None:
        rows = hooks.audio(batch)
    if hooks.loss is not None:  # speed.label_head: no full logits; the hook returns their statistics instead
        return hooks.loss(model, batch, rows, hooks.logit_stats)
    logits = model(batch) if rows is None else model(batch, audio_rows=rows)  # a text family takes no audio rows
    loss, correct, count = lm_loss(logits, batch.labels)
    return logits, loss, correct, count


def logit_stats(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """abs-mean and std (fp32) of the logits at labelled positions (what the loss sees)."""
    if isinstance(logits, tuple):  # speed.label_head computed them from the gathered labelled rows
        return logits
    with torch.no_grad():
        # Masked sums instead of boolean indexing: indexing would need the count on the host (a sync).
        lf = logits[:, :-1].float()
        m = (labels[:, 1:] != -100).unsqueeze(-1).to(lf.dtype)
        n = m.sum() * lf.shape[-1]
        mean = (lf * m).sum() / n
        var = ((lf - mean).pow(2) * m).sum() / (n - 1)
        return (lf.abs() * m).sum() / n, var.sqrt()


class TrainStep:
    """The step. ``on_device_skip`` (a fused AdamW) keeps everything on the device: the non-finite skip is the
    kernel's found_inf and clipping is the kernel's grad_scale; otherwise FunASR's rule reads the norm once
    (a sync), clips the gradients in place and skips a non-finite step with its schedule."""

    def __init__(self, model, optimizer: torch.optim.Optimizer, schedule: WarmupLR, *, grad_clip: float,
                 on_device_skip: bool = False, persistent_grads: bool = False, hooks: StepHooks | None = None):
        self.model, self.optimizer, self.schedule = model, optimizer, schedule
        self.grad_clip = grad_clip
        self.on_device_skip = on_device_skip
        self.hooks = hooks or StepHooks()
        self.params = trainable_params(model)
        # CUDA graphs (without speed.fresh_grads): gradients are fixed buffers, zeroed in place and added into.
        # Otherwise each step starts from no gradients and backward hands every parameter a new tensor.
        self.persistent_grads = persistent_grads
        # A warm-up step (speed.cuda_graph) that must change nothing: the fused update is skipped as for a
        # non-finite norm. Never set while a graph is captured (the skip would be recorded into it).
        self.dry = False
        self._skipped = False
        self._present: dict[tuple, torch.Tensor] = {}  # which parameters have a gradient -> that mask on the device
        self.group_index = None
        if self.hooks.grad_groups is not None:
            self.group_index = torch.tensor([self.hooks.grad_groups[id(p)] for p in self.params],
                                            device=self.params[0].device)
            self.n_groups = max(self.hooks.grad_groups.values()) + 1

    def __call__(self, batches: list[Batch]) -> dict[str, torch.Tensor]:
        metrics = self.body(batches, mark=self.hooks.mark)
        self.advance(metrics)
        return metrics

    # StepFunction: an eager step captures nothing and uses its hooks' audio provider
    @property
    def audio(self):
        return self.hooks.audio

    @property
    def captures(self) -> dict[str, int]:
        return {}

    def no_new_audio_graphs(self) -> AbstractContextManager:
        return nullcontext()

    def advance(self, metrics: dict[str, torch.Tensor]) -> None:
        """The schedule's step, on the host after the body (a graph cannot hold it): every attempted step
        on the device path, only taken steps under FunASR's rule (whose body already read the skip)."""
        if self.on_device_skip or not self._skipped:
            self.schedule.step()

    # ------------------------------------------------------------------------------------ the body
    def body(self, batches: list[Batch], rows: list[torch.Tensor] | None = None,
             mark: Callable[[str], None] = _no_mark) -> dict[str, torch.Tensor]:
        h = self.hooks
        self.optimizer.zero_grad(set_to_none=not self.persistent_grads)
        metrics: dict[str, torch.Tensor] = {}
        n = len(batches)
        for i, batch in enumerate(batches):  # gradient accumulation: FunASR scales each micro-batch loss by 1/accum
            logits, loss, correct, count = model_loss(self.model, batch, h, rows[i] if rows is not None else None)
            out = {"loss": loss.detach(), "correct": correct, "count": count}
            if h.logit_stats:
                out["logits_absmean"], out["logits_std"] = logit_stats(logits, batch.labels)
            del logits
            mark("forward")
            if h.in_backward is not None and i == n - 1:  # the updates follow only the final gradients
                h.in_backward.arm()
            (loss / n if n > 1 else loss).backward()
            mark("backward")
            for k, v in out.items():
                metrics[k] = metrics[k] + v if k in metrics else v
        if n > 1:
            for k in ("loss", "logits_absmean", "logits_std"):
                if k in metrics:
                    metrics[k] = metrics[k] / n
        grads = [p.grad for p in self.params if p.grad is not None]
        h.sync_grads(grads)
        norm = self._norms(grads, metrics)
        metrics["grad_norm"] = norm.detach()
        metrics["skipped"] = self._update(grads, norm)
        mark("optimizer")
        return metrics

    def _norms(self, grads: list[torch.Tensor], metrics: dict) -> torch.Tensor:
        """Total L2 norm of the gradients before clipping (as clip_grad_norm_ computes it), and per-group norms
        for the probe from the same per-tensor norms: device tensors, no sync."""
        if not grads:
            return torch.zeros((), device=self.params[0].device)
        if hasattr(grads[0], "to_local"):  # FSDP2 shards: local sums of squares, added over ranks (one all-reduce)
            sq = torch.stack([g.to_local().float().pow(2).sum() for g in grads])
            torch.distributed.all_reduce(sq)
            per = sq.sqrt()
        elif self.hooks.in_backward is not None:  # taken per layer before its update (and any clipping)
            per = self.hooks.in_backward.tensor_norms(grads)
        else:
            per = tensor_norms(grads)  # [tensors]
        if self.group_index is not None:
            if len(grads) != len(self.params):  # a parameter without a gradient (unused in this step)
                present = tuple(p.grad is not None for p in self.params)
                have = self._present.get(present)
                if have is None:  # made by the eager warm-up before a capture: a graph cannot copy from the host
                    have = self._present[present] = torch.tensor(present, device=per.device)
                per_all = per.new_zeros(len(self.params)).masked_scatter(have, per)
            else:
                per_all = per
            sq = per.new_zeros(self.n_groups).index_add_(0, self.group_index, per_all.square())
            metrics["module_norms"] = sq.sqrt()
        return torch.linalg.vector_norm(per)

    def _update(self, grads: list[torch.Tensor], norm: torch.Tensor) -> torch.Tensor:
        """One optimizer step unless the norm is not finite; returns 1.0 (skipped) or 0.0 on the device."""
        opt, clip = self.optimizer, self.grad_clip
        if self.hooks.in_backward is not None:  # the layers are updated already; the rest and the join
            self._skipped = False
            return self.hooks.in_backward.finish(norm)
        if self.on_device_skip:
            found_inf = (~torch.isfinite(norm)).to(torch.float32)
            if self.dry:
                found_inf = torch.ones_like(found_inf)
            opt.found_inf = found_inf
            if clip > 0:  # grads / scale == grads * min(1, clip / (norm + 1e-6)), applied inside the kernel
                opt.grad_scale = torch.clamp((norm.float() + 1e-6) / clip, min=1.0)
            try:
                opt.step()
            finally:
                del opt.found_inf
                if clip > 0:
                    del opt.grad_scale
            self._skipped = False
            return found_inf
        self._skipped = not bool(torch.isfinite(norm))  # FunASR's rule: one host read of the norm
        if not self._skipped:
            if clip > 0:
                torch.nn.utils.clip_grads_with_norm_(self.params, clip, norm)
            opt.step()
        return torch.full((), float(self._skipped), device=norm.device)
