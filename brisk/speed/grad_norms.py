"""Per-tensor gradient norms as one vector, for the step's global norm and the probe's per-module norms."""

from __future__ import annotations

import torch


def tensor_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's L2 norm (torch's foreach kernel, as clip_grad_norm_ takes them), as one fp32 vector.

    Stacked in the tensors' own dtype and then cast: casting each bf16 norm before the stack launched a
    one-element copy kernel per parameter. The same bits: every bf16 value is an fp32
    value."""
    return torch.stack(torch._foreach_norm(tensors)).float()
