"""speed.sdpa_backends: run the LLM's attention with exactly the listed SDPA backends.

What it really is: ``torch.nn.attention.sdpa_kernel`` around the run (``flags.run_scope``: steps, validation,
graph capture). That is a process-wide selection, visible to every thread of the process (not local to the
model); the previous flags are restored when the run ends. It exists because on sm_90/sm_100 torch
builds that put cuDNN first in the SDPA order send the LLM's padded-mask attention to cuDNN, which builds an
execution plan for every new (batch, length) shape: about 0.5 s forward and 0.5 s backward each time.
Selecting [flash, efficient, math] avoids that; TORCH_CUDNN_SDPA_DEPRIORITIZED=1 in the environment does the
same process-wide without a config change. The backward uses the kernel the forward chose.
"""

from __future__ import annotations

from typing import ContextManager

from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def sdpa_scope(names: list[str]) -> ContextManager:
    return sdpa_kernel([BACKENDS[n] for n in names])
