"""speed.compile: torch.compile the LLM decoder, applied from outside the model.

scope=layer compiles each decoder layer's forward. The layers share one code object and Dynamo lifts
module parameters to graph inputs, so one compiled graph serves all 28 layers: the compile costs one
layer's worth, not the stack's, and a recompile (a new dynamic-shape guard) is one layer's worth too.
scope=stack compiles the whole decoder stack (what FunASR's PR did). Either way:

- the compiled code is used only when the hidden states are on a CUDA device, decided per call;
- a padded batch of one sequence stays eager (Dynamo would specialise the size-1 batch into its own graph);
- the decoder runs eagerly without autograd (validation, decoding): no-grad mode is a graph of its own, and
  its compile (~2 s warm, more cold, on the H200) costs more than it saves on a validation set;
- ``speed.compile_dynamic=true`` (the default) compiles one graph for every length from the start; with
  None, Dynamo first compiles a static graph and then, at the second length, a dynamic one: two compiles;
- a compile error falls back to eager with a warning (speed.compile_on_error=raise to fail instead);
- the module tree and state_dict keys are unchanged: only the instance's ``forward`` is replaced.

The Inductor cache folder (speed.inductor_cache_dir; else TORCHINDUCTOR_CACHE_DIR; else
~/.cache/brisk/inductor) is exported as TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR before the first
compile and printed, so a second run starts warm.
"""

from __future__ import annotations

import logging
import os
import time

import torch
from torch import nn

from ..config import SpeedConfig

log = logging.getLogger("brisk")


def compile_counters() -> dict:
    """Dynamo's own counters: unique graphs compiled so far and recompiles (for the slow-step detector)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # pragma: no cover
        return {}
    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0}


def _first_tensor(args, kwargs) -> torch.Tensor | None:
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v
    return None


class CudaOnlyCompiled:
    """forward replacement: compiled for CUDA inputs, eager otherwise (and after a failure under warn)."""

    def __init__(self, eager, name: str, dynamic: bool | None, on_error: str, train_only: bool = False):
        self.eager = eager
        self.compiled = torch.compile(eager, dynamic=dynamic)
        self.name, self.on_error, self.train_only = name, on_error, train_only
        self.failed = False
        self.compile_seconds = 0.0

    def __call__(self, *args, **kwargs):
        x = _first_tensor(args, kwargs)
        if self.failed or x is None or not x.is_cuda or (self.train_only and not torch.is_grad_enabled()):
            return self.eager(*args, **kwargs)
        if x.dim() >= 2 and x.shape[0] == 1 and kwargs.get("cu_seq_lens_q") is None:
            return self.eager(*args, **kwargs)  # a single padded sequence: keep Dynamo off size 1
        if args and args[0] is x and x._base is not None:
            # Dynamo guards on a view's base: the first decoder layer gets the embeddings as a view, the others
            # a fresh tensor, which made two graphs of one layer. A copy (one small kernel) makes them one.
            args = (x.clone(),) + args[1:]
        before = compile_counters().get("graphs", 0)
        t0 = time.perf_counter()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any compiler failure
            if self.on_error == "raise":
                raise
            log.warning("speed.compile: compiling %s failed (%s: %s); falling back to eager for the rest of the run",
                        self.name, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            self.failed = True
            return self.eager(*args, **kwargs)
        if compile_counters().get("graphs", 0) > before:
            dt = time.perf_counter() - t0
            self.compile_seconds += dt
            log.info("speed.compile: compiled %s for input %s in %.1f s", self.name, tuple(x.shape), dt)
        return out


def decoder_stack(llm: nn.Module) -> nn.Module:
    base = getattr(llm, llm.base_model_prefix, None) if hasattr(llm, "base_model_prefix") else None
    if base is None or not hasattr(base, "layers"):
        raise ValueError("speed.compile: could not find the decoder stack (model.<base>.layers) of this LLM")
    return base


def inductor_cache_dir(cfg: SpeedConfig) -> tuple[str, str]:
    """(folder, where it came from): speed.inductor_cache_dir, else TORCHINDUCTOR_CACHE_DIR, else the user's
    cache folder (~/.cache/brisk/inductor). A persistent folder makes a second run's compile a cache hit
    (torch's own default, /tmp/torchinductor_<user>, is lost at reboot and on fresh machines)."""
    if cfg.inductor_cache_dir:
        return cfg.inductor_cache_dir, "speed.inductor_cache_dir"
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"], "TORCHINDUCTOR_CACHE_DIR"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "brisk", "inductor"), "default"


def apply_compile(model: nn.Module, cfg: SpeedConfig, audio_encoder: nn.Module | None = None) -> str:
    """``audio_encoder``: the frozen encoder that computes the audio rows (a bf16 copy under encoder_dtype)."""
    cache, source = inductor_cache_dir(cfg)
    os.makedirs(cache, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache, "triton"))
    stack = decoder_stack(model.llm)
    targets = list(enumerate(stack.layers)) if cfg.compile_scope == "layer" else [(None, stack)]
    for i, module in targets:
        name = "decoder stack" if i is None else "decoder layer"
        module.forward = CudaOnlyCompiled(module.forward, name, cfg.compile_dynamic, cfg.compile_on_error, train_only=True)
    what = f"{len(targets)} x {'decoder layer' if cfg.compile_scope == 'layer' else 'decoder stack'}"
    if cfg.frozen_eval and cfg.compile_encoder and model.cfg.encoder.freeze:
        # A frozen encoder in eval mode has no dropout and no autograd: its blocks compile cleanly, and
        # fusing their elementwise work removes ~2,000 small kernels a step. The first block (encoders0) takes
        # the 560-wide LFR features, a graph of its own for one block of 70: it stays eager.
        enc = audio_encoder if audio_encoder is not None else model.audio_encoder
        blocks = [*enc.encoders, *enc.tp_encoders]
        for block in blocks:
            block.forward = CudaOnlyCompiled(block.forward, "encoder block", cfg.compile_dynamic, cfg.compile_on_error)
        what += f" + {len(blocks)} x frozen encoder block"
    return (f"compile: {what}, dynamic={cfg.compile_dynamic}, CUDA inputs only, on_error={cfg.compile_on_error}, "
            f"inductor cache {cache} ({source})")


def total_compile_seconds(model: nn.Module) -> float:
    seen, total = set(), 0.0
    for m in model.modules():
        f = m.__dict__.get("forward")
        if isinstance(f, CudaOnlyCompiled) and id(f) not in seen:
            seen.add(id(f))
            total += f.compile_seconds
    return total
