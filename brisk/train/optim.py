"""AdamW, FunASR's warm-up schedule, and loading an optimizer state without losing its device lr."""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..config import OptimConfig


def trainable_params(model: nn.Module) -> list[nn.Parameter]:
    seen, out = set(), []
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def build_optimizer(model: nn.Module, cfg: OptimConfig, *, fused: bool = False, capturable: bool = False) -> torch.optim.AdamW:
    params = trainable_params(model)
    if not params:
        raise ValueError("nothing to train: every module is frozen (check model.*.freeze)")
    kwargs = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if fused:
        kwargs["fused"] = True
    if capturable:  # CUDA-graph replay: lr and step live on the device
        kwargs.update(capturable=True, lr=torch.tensor(cfg.lr, device=params[0].device))
    return torch.optim.AdamW(params, **kwargs)


def schedule_for(cfg) -> tuple[float, int, list[str]]:
    """(peak lr, optimizer steps of warmup, log lines) for this run's batch (data.batch_tokens x train.accum_grad).
    optim.lr and optim.warmup_steps as given, unless optim.warmup_step_tokens names the batch they were chosen for
    and this batch differs: the warmup is scaled to the same tokens (FunASR's schedule at warmup w / f gives at step
    k / f the learning rate it gives at step k with warmup w), and with optim.lr_scale=sqrt the peak lr is scaled by
    sqrt(f) (each step now averages f times the tokens)."""
    o, tokens = cfg.optim, cfg.data.batch_tokens * cfg.train.accum_grad
    if not o.warmup_step_tokens or tokens == o.warmup_step_tokens:
        return o.lr, o.warmup_steps, []
    f = tokens / o.warmup_step_tokens
    steps = max(1, round(o.warmup_steps / f))
    notes = [f"optim: warmup {o.warmup_steps} steps of {o.warmup_step_tokens:,} tokens -> {steps} steps of {tokens:,} "
             "(data.batch_tokens x train.accum_grad): the same schedule at each token seen"]
    lr = o.lr
    if o.lr_scale == "sqrt":
        lr = o.lr * f**0.5
        notes.append(f"optim: lr {o.lr:.3g} -> {lr:.3g} (optim.lr_scale=sqrt: x sqrt({tokens:,} / "
                     f"{o.warmup_step_tokens:,}))")
    return lr, steps, notes


class WarmupLR:
    """FunASR's WarmupLR: lr(k) = base * w**0.5 * min(k**-0.5, k * w**-1.5) for optimizer step k = 1, 2, ...

    The peak is ``base`` at k = w. Writes the value into the param groups before each step, as a float, or
    in place into a tensor lr (so a captured CUDA graph sees it).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, base_lr: float, warmup_steps: int):
        self.opt, self.base, self.warmup = optimizer, base_lr, max(1, warmup_steps)
        self.step_num = 0  # optimizer steps taken
        self._apply(self.lr_at(1))

    def lr_at(self, k: int) -> float:
        w = self.warmup
        return self.base * w**0.5 * min(k**-0.5, k * w**-1.5)

    def _apply(self, lr: float) -> None:
        for group in self.opt.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    @property
    def lr(self) -> float:
        return self.lr_at(self.step_num + 1)

    def step(self) -> None:
        self.step_num += 1
        self._apply(self.lr_at(self.step_num + 1))

    def state_dict(self) -> dict:
        return {"step_num": self.step_num, "base": self.base, "warmup": self.warmup}

    def load_state_dict(self, state: dict) -> None:
        self.step_num = state["step_num"]
        if (state.get("base"), state.get("warmup")) != (self.base, self.warmup):  # another batch or config on resume
            logging.getLogger("brisk").info(
                "optim: resumed at step %d with peak lr %.3g and %d warm-up steps (the checkpoint's run: %s and %s): "
                "lr now %.3g", self.step_num, self.base, self.warmup, state.get("base"), state.get("warmup"),
                self.lr_at(self.step_num + 1))
        self._apply(self.lr_at(self.step_num + 1))


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """``optimizer.load_state_dict`` that keeps each group's tensor lr the very tensor it was.

    load_state_dict replaces the param groups with the saved ones, so a tensor lr would become the loaded
    copy (a CPU tensor after map_location="cpu"). A captured CUDA graph and the schedule hold the original
    device tensor: the loaded value is copied into it and it is put back. (Capturable/fused ``step`` states
    are moved to the parameters' device by torch itself.)
    """
    lrs = [g["lr"] for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, lr in zip(optimizer.param_groups, lrs):
        if isinstance(lr, torch.Tensor):
            lr.copy_(torch.as_tensor(group["lr"]))
            group["lr"] = lr
