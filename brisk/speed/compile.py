"""speed.compile: torch.compile the LLM's decoder layers (and the frozen encoder's blocks), from outside.

Each module is compiled with ``nn.Module.compile`` (torchtitan's way): the module tree, its forward and the
state dict are unchanged. What the run decides once, not per call:

- only on a CUDA device (on the CPU the switch compiles nothing and says so);
- scope=layer compiles each decoder layer: the layers share one code object and Dynamo lifts module parameters
  to graph inputs, so one graph serves every layer and a recompile costs one layer's worth; scope=stack
  compiles the whole decoder stack;
- ``speed.compile_dynamic=true`` (the default) compiles one graph for every length from the start; with None
  Dynamo first compiles a static graph and then, at the second length, a dynamic one; with false each row length
  gets a static decoder-layer graph (the frozen encoder's blocks stay dynamic);
- validation and decoding run the decoder eagerly (``eval_context``: ``torch.compiler.set_stance
  ("force_eager")``): no-grad mode would be a graph of its own, compiled for a few validation batches;
- the first decoder layer's input is made a fresh tensor by a forward pre-hook on the decoder stack: the
  embeddings with the audio spliced in arrive as a view, the other layers get fresh tensors, and Dynamo
  guards on a view's base (two graphs of one layer without it);
- compile_on_error=warn: Dynamo falls back to eager where a compile fails (``flags.run_scope`` sets
  suppress_errors for the run and restores it).

The Inductor cache folder (speed.inductor_cache_dir; else TORCHINDUCTOR_CACHE_DIR; else
~/.cache/brisk/inductor) is exported as TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR before the first compile
and printed, so a second run starts warm.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from torch import nn

from ..config import SpeedConfig
from ..families import get as get_family


def compile_counters() -> dict:
    """Dynamo's own counters: unique graphs compiled so far and recompiles (for the slow-step detector)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # pragma: no cover
        return {}
    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0}


def compile_seconds() -> float:
    """Seconds torch.compile spent compiling in this process so far: Dynamo's own timer around each frame's
    compile, plus AOTAutograd's backward graphs compiled lazily at their first backward (timed apart)."""
    return sum(compile_split().values())


def compile_split() -> dict[str, float]:
    """compile_seconds() in three parts, from the same timers: Dynamo's own work on a frame (tracing the bytecode,
    building guards), the backend it calls (AOTAutograd and Inductor: lowering and code generation, or on a warm
    start the cache lookups and loading the cached kernels), and backward graphs compiled at their first backward.
    A warm start's compile seconds tell which of the three to cut."""
    try:
        from torch._dynamo.utils import compilation_time_metrics as m
    except Exception:  # pragma: no cover
        return {"trace": 0.0, "backend": 0.0, "backward": 0.0}
    frame = float(sum(m.get("_compile.compile_inner", [])))  # the frame's whole compile, the backend's inside it
    backend = float(sum(m.get("OutputGraph.call_user_compiler", [])))
    return {"trace": max(0.0, frame - backend), "backend": backend,
            "backward": float(sum(m.get("backward._backward_impl", [])))}


def decoder_stack(llm: nn.Module) -> nn.Module:
    base = getattr(llm, llm.base_model_prefix, None) if hasattr(llm, "base_model_prefix") else None
    if base is None or not hasattr(base, "layers"):
        raise ValueError("could not find the decoder stack (model.<base>.layers) of this LLM")
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


def _fresh_input(module, args, kwargs):
    """Forward pre-hook of the decoder stack: the embeddings as a tensor of their own, not a view."""
    x = kwargs.get("inputs_embeds")
    if isinstance(x, torch.Tensor) and x._base is not None:
        return args, {**kwargs, "inputs_embeds": x.clone()}
    return None


def eval_context(speed: SpeedConfig):
    """What validation and decoding run under: compiled modules run eagerly there."""
    if speed.compile:
        return lambda: torch.compiler.set_stance("force_eager")
    return nullcontext


def apply_compile(model: nn.Module, cfg: SpeedConfig, device_type: str, audio_path: nn.Module | None = None,
                  backend: str = "inductor") -> str:
    """``audio_path``: what computes the frozen audio rows (the model, or its bf16 copies under encoder_dtype);
    the model family (``model.cfg.family``) says which of its encoder blocks compile. ``backend``: Dynamo's
    backend (the CPU tests trace with aot_eager: Dynamo and AOTAutograd without Inductor's code generation).

    A chat model's Gated DeltaNet layers keep their kernels out of the graphs: flash-linear-attention's conv and
    delta rule (speed.fla_kernels) and its gated norm run eagerly between a layer's graphs
    (``torch.compiler.disable``; such a layer compiles to at most 4 graphs, broken only there), and the torch
    fallbacks under packing (linear_attention_batched, per sequence) run the whole mixer eagerly (their shapes
    come from a host read of cu_seqlens: a graph would specialise on every batch's lengths)."""
    if device_type != "cuda":
        return f"compile: nothing compiled on {device_type} (the compiled kernels are for CUDA devices)"
    cache, source = inductor_cache_dir(cfg)
    os.makedirs(cache, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache, "triton"))
    stack = decoder_stack(model.llm)
    targets = list(stack.layers) if cfg.compile_scope == "layer" else [stack]
    for module in targets:
        module.compile(dynamic=cfg.compile_dynamic, backend=backend)
    if cfg.compile_scope == "layer":
        stack.register_forward_pre_hook(_fresh_input, with_kwargs=True)
    what = f"{len(targets)} x {'decoder layer' if cfg.compile_scope == 'layer' else 'decoder stack'}"
    family = get_family(model.cfg.family)
    blocks = [b for lst in family.encoder_blocks(audio_path if audio_path is not None else model, compile=True)
              for b in lst]
    frozen = cfg.frozen_eval and model.cfg.encoder.freeze
    # A training encoder compiles where the family's step graph holds it (Family.trained_audio_graph): its
    # blocks then run from the same static inputs a bucket (a fixed longest window), under autograd
    trained = (cfg.cuda_graph and not model.cfg.encoder.freeze
               and family.trained_audio_graph(cfg, model.cfg) is None)
    if cfg.compile_encoder and blocks and (frozen or trained):
        # A frozen encoder in eval mode has no dropout and no autograd: its blocks compile cleanly, and fusing
        # their elementwise work removes thousands of small kernels a step (the family says which blocks).
        # Static encoder graphs would be one per (utterances, frames) bucket pair, past Dynamo's 8 a block: the
        # blocks stay dynamic under compile_dynamic=false (which is for the decoder layers' row lengths).
        dynamic = True if cfg.compile_dynamic is False else cfg.compile_dynamic
        for block in blocks:
            block.compile(dynamic=dynamic, backend=backend)
        what += (f" + {len(blocks)} x {'frozen' if frozen else 'training'} encoder block"
                 + (" (dynamic)" if dynamic != cfg.compile_dynamic else ""))
    return (f"compile: {what}, dynamic={cfg.compile_dynamic}, on_error={cfg.compile_on_error}, validation eager, "
            f"inductor cache {cache} ({source})")
