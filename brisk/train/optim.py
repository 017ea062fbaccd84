"""AdamW, FunASR's warm-up schedule, and the update with clipping and the non-finite skip."""

from __future__ import annotations

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
        self._apply(self.lr_at(self.step_num + 1))


def clip_grads(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Total L2 norm of the gradients before clipping (a device tensor: no sync)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if max_norm > 0 else torch.nn.utils.get_total_norm(grads)
    return full(norm)


def full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: sharded (FSDP2) gradients give a DTensor norm; its full value is the same on every rank."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def update(optimizer: torch.optim.Optimizer, schedule: WarmupLR, norm: torch.Tensor, *, on_device: bool) -> torch.Tensor:
    """One optimizer step unless the gradient norm is not finite; returns 1.0 (skipped) or 0.0 on the device.

    on_device=False is FunASR's rule: read the norm on the host (one sync), skip the optimizer and the
    schedule on a non-finite norm. on_device=True needs a fused AdamW: the skip happens inside the kernel
    (found_inf), nothing is read back, and the schedule advances on every attempted step.
    """
    if on_device:
        found_inf = (~torch.isfinite(norm)).to(torch.float32)
        optimizer.found_inf = found_inf
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
        schedule.step()
        return found_inf
    if not bool(torch.isfinite(norm)):
        return torch.ones((), device=norm.device)
    optimizer.step()
    schedule.step()
    return torch.zeros((), device=norm.device)
