"""The acceleration state of a run, in one line at start and in accel.json in the run folder.

Also the cuDNN-SDPA plan-build check: on sm_90/sm_100 with a torch that puts cuDNN first in the SDPA order,
an attention call with an explicit (padding) mask goes to cuDNN, which builds an execution plan for every
new (batch, length) shape, ~0.5 s in forward and ~0.5 s in backward.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

import torch

from ..config import Config
from ..plan import switches_on
from ..speed.flags import backend_flags

_SDP_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def sdpa_order() -> list[str]:
    try:
        return [_SDP_NAMES.get(int(i), str(i)) for i in torch._C._get_sdp_priority_order()]
    except Exception:  # pragma: no cover - older torch
        return []


def masked_sdpa_backend(device: torch.device) -> str:
    """Run one padded-mask bf16 attention call and read which kernel the profiler saw.

    Empirical on purpose: on sm_90 torch 2.11 lists flash > efficient > math > cudnn as the priority order
    and still sends a masked call to cuDNN (it prefers cuDNN for masks on Hopper unless
    TORCH_CUDNN_SDPA_DEPRIORITIZED=1), so the order alone does not tell.
    """
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(2, 16, 64, 128, device=device, dtype=torch.bfloat16)
    mask = torch.ones(2, 1, 64, 64, device=device, dtype=torch.bool)
    mask[1, :, :, 48:] = False
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    names = " ".join(e.name for e in prof.events()).lower()
    for key, label in (("cudnn", "cuDNN"), ("flash", "flash"), ("efficient", "memory-efficient"), ("math", "math")):
        if key in names:
            return label
    return "unknown"


def plan_build_trap(device: torch.device, cfg: Config) -> str | None:
    """Why first-seen shapes would build cuDNN plans in this run, or None if they cannot."""
    if device.type != "cuda":
        return None
    major, _ = torch.cuda.get_device_capability(device)
    if major not in (9, 10):
        return None
    if cfg.speed.packing and not cfg.speed.sdpa_backends:
        return None  # packed rows use varlen attention, no padded-mask SDPA call
    if cfg.speed.sdpa_backends and "cudnn" not in cfg.speed.sdpa_backends:
        return None
    if masked_sdpa_backend(device) != "cuDNN":
        return None
    return (f"sm_{major}x: a padded-mask attention call takes cuDNN here, so the LLM's padded-mask "
            "attention goes to cuDNN, which builds an execution plan for every new (batch, length) shape, "
            "~0.5 s forward + ~0.5 s backward. Fix: speed.sdpa_backends=[flash,efficient,math] "
            "or TORCH_CUDNN_SDPA_DEPRIORITIZED=1 in the environment")


def acceleration_state(cfg: Config, device: torch.device, plan=None) -> dict:
    """``plan``: the run's SpeedPlan (its switches on, preset and notes); without one, read from cfg.speed."""
    state = {
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "speed": asdict(cfg.speed),
        "switches_on": list(plan.on) if plan is not None else switches_on(cfg.speed),
        "preset": cfg.speed.preset,
        "plan_notes": list(plan.notes) if plan is not None else [],
        "llm_dtype": cfg.model.llm.dtype,
        "encoder_dtype": cfg.speed.encoder_dtype,
        "flags": backend_flags(),
        "sdpa_order": sdpa_order(),
        "env": {k: os.environ[k] for k in ("TORCH_CUDNN_SDPA_DEPRIORITIZED", "TORCHINDUCTOR_CACHE_DIR",
                                            "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS") if k in os.environ},
    }
    try:
        import transformers

        state["transformers"] = transformers.__version__
    except Exception:  # pragma: no cover
        pass
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        state.update(gpu=p.name, capability=f"sm_{p.major}{p.minor}", cuda=torch.version.cuda,
                     cudnn=torch.backends.cudnn.version())
    else:
        state["threads"] = torch.get_num_threads()
    state["plan_build_trap"] = plan_build_trap(device, cfg)
    return state


def write_state(state: dict, run_dir: Path) -> None:
    (run_dir / "accel.json").write_text(json.dumps(state, indent=2, default=str), encoding="utf-8")
