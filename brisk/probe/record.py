"""Probe recording: what a run computes, per step, in a file per rank (``probe.rank<r>.jsonl``).

Format: the first line is a header {"probe": 1, "rank": r, "config": {...}}; every other line is one
checkpoint {"step": s, "metric": name, "value": v}. Metrics:

every step   loss, grad_norm (before clipping), logits_absmean and logits_std (fp32, labelled positions),
             argmax_correct (argmax tokens equal to the label) and label_tokens, skipped (non-finite step),
             batch.rows, batch.len, batch.utts, batch.tokens, batch.speech_frames (shapes)
chosen steps param_norm (L2 of the trainable parameters after the update),
             grad_norm.<module> (per module, before clipping) for probe.param_norm_steps
validation   val_loss, val_acc, val_tokens

Cheap enough to leave on: the per-step values ride on the metrics read-back the trainer does anyway
(one sync per log interval); only the chosen steps pay a sync for the norms.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from torch import nn

PER_STEP = ("loss", "grad_norm", "logits_absmean", "logits_std", "skipped")


def _full(t: torch.Tensor) -> torch.Tensor:
    """FSDP2 shards are DTensors; their sums are partial per rank until reduced (a collective, all ranks)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def module_of(name: str) -> str:
    """Group a parameter name: decoder layers individually, everything else by its first two parts."""
    m = re.match(r"(.*?\blayers\.\d+)\.", name)
    if m:
        return m.group(1)
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


class ProbeRecorder:
    def __init__(self, path: Path, model: nn.Module, steps: list[int], rank: int = 0, config: dict | None = None):
        self.model, self.steps = model, set(steps)
        self.file = path.open("w", encoding="utf-8")
        self.file.write(json.dumps({"probe": 1, "rank": rank, "config": config or {}}, default=str) + "\n")
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.groups = sorted({module_of(n) for n, _ in self.named})
        slot = {g: i for i, g in enumerate(self.groups)}
        # For the step (StepHooks.grad_groups): it returns one device vector of per-group gradient norms,
        # computed before clipping from the same per-tensor norms as the total grad_norm.
        self.grad_groups = {id(p): slot[module_of(n)] for n, p in self.named}

    def _put(self, step: int, metric: str, value: float) -> None:
        self.file.write(json.dumps({"step": step, "metric": metric, "value": value}) + "\n")

    def on_metrics(self, step: int, row: dict) -> None:
        for k in PER_STEP:
            if k in row:
                self._put(step, k, row[k])
        self._put(step, "argmax_correct", row["correct"])
        self._put(step, "label_tokens", row["count"])

    def on_batch(self, step: int, batch) -> None:
        s = batch.shape
        for k in ("rows", "len", "utts", "tokens", "speech_frames"):
            self._put(step, f"batch.{k}", s.get(k, 0))  # a text family's batch has no speech frames

    @torch.no_grad()
    def after_step(self, step: int, module_norms: torch.Tensor | None = None) -> None:
        """At the chosen steps: per-module gradient norms (before clipping) and the parameter norm (after the
        update). Reading them costs one sync, on these steps only."""
        if step not in self.steps:
            return
        if module_norms is not None:
            for g, v in zip(self.groups, module_norms.tolist()):
                self._put(step, f"grad_norm.{g}", v)
        total = sum(float(_full(p.detach().float().pow(2).sum())) for _, p in self.named)
        self._put(step, "param_norm", math.sqrt(total))

    def on_validation(self, step: int, val: dict) -> None:
        for k, v in val.items():
            self._put(step, f"val_{k}", v)
        self.file.flush()

    def close(self) -> None:
        self.file.close()
