"""Speed switches, applied from outside the plain model and around the plain step.

Which switches a run uses, and which go together, is decided before any model exists (brisk/plan.py: the
``SpeedPlan``). This package carries it out, in three kinds of function:

- ``accelerate(model, plan)``: the model-side switches, in a fixed order, each by its own ``apply_*``
  function (module swaps, ``nn.Module.compile``, the attention implementation). Returns the ``Accelerated``
  parts the step and validation take (the frozen audio provider, the loss hook, how to enter training mode,
  what validation runs under) and the notes of what was done. Nothing is assigned onto a module instance.
- ``flags.run_scope(cfg)``: the process-wide flags (cuDNN's deterministic algorithms, TF32, SDPA backends,
  Dynamo's error fallback), entered around everything that picks kernels, graph capture included, and restored
  after.
- ``graph.GraphedStep``: the step-side wrapper that captures a step function per bucket and replays it.

With every switch off, ``accelerate`` touches nothing.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from ..families import get as get_family
from ..plan import SpeedPlan
from .frozen import FrozenAudio, apply_frozen_eval, training_mode


@dataclass
class Accelerated:
    notes: list[str] = field(default_factory=list)
    audio: FrozenAudio | None = None  # the frozen audio rows (speed.frozen_eval)
    loss: Callable | None = None  # StepHooks.loss (speed.label_head)
    train_mode: Callable[[], None] | None = None  # puts the model in training mode (frozen parts stay in eval)
    eval_context: Callable[[], ContextManager] = nullcontext  # around validation and decoding
    decode_context: Callable[[], ContextManager] = nullcontext  # around greedy decoding (padded rows, a KV cache)


def accelerate(model, plan: SpeedPlan) -> Accelerated:
    """Apply the model-side switches of ``plan`` to ``model`` (the plain model of ``plan.family``, whose hooks say
    where its audio modules and encoder blocks are), in this order: the frozen audio
    path (its copies are what compile compiles), varlen (or flex) attention, the audio tower's one-call attention, fused projections (before compile: the
    compiled layers trace the fused forwards), the chunked embedding (graphs), compile, the label head."""
    s = plan.speed
    family = get_family(plan.family)
    out = Accelerated(train_mode=training_mode(model, s.frozen_eval))
    if s.frozen_eval:
        out.notes.append(apply_frozen_eval(model))
        dtype = torch.bfloat16 if s.encoder_dtype == "bf16" else torch.float32
        out.audio = FrozenAudio(model, dtype, cache=s.encoder_cache, names=family.audio_path)
        if dtype != torch.float32:
            out.notes.append("encoder_dtype: frozen encoder and adaptor run as bf16 copies (the fp32 originals are saved)")
        if s.encoder_cache:
            out.notes.append("encoder_cache: audio rows kept per utterance and reused in later epochs")
    out.notes += _llm_kernels(model, plan)
    if s.packing:
        if plan.device == "cuda":
            from .varlen import apply_varlen_attention, padded_attention

            if s.flex_attention:
                from .flex import apply_flex_attention

                out.notes.append(apply_flex_attention(model.llm, inline=s.compile_dynamic is False))
            else:
                out.notes.append(apply_varlen_attention(model.llm))
            out.decode_context = lambda: padded_attention(model.llm)
        else:
            out.notes.append("packing: one row per batch; CPU attention gets transformers' block-diagonal mask")
    if s.audio_varlen:  # before compile: the compiled encoder blocks trace the one-call attention
        from .audio_varlen import apply_audio_varlen, audio_blocks

        path = out.audio.path if out.audio is not None else None
        out.notes.append(apply_audio_varlen(audio_blocks(family, model, path)))
    if s.fuse_projections:
        from .fuse import apply_fuse_projections

        out.notes.append(apply_fuse_projections(model.llm))
    if s.liger:  # after fuse_projections: the fused gate/up GEMM feeds liger's SwiGLU (llm_kernels.LigerMLP)
        from .llm_kernels import apply_liger_kernels

        out.notes.append(apply_liger_kernels(model))
    if s.fla_gated_norm:
        from .llm_kernels import apply_fla_gated_norm

        out.notes.append(apply_fla_gated_norm(model))
    if s.float8:  # after the fused projections (their GEMMs are the ones cast), before compile (which fuses the casts)
        from .float8 import apply_float8

        out.notes.append(apply_float8(family.decoder_layers(model), plan.device))
    if s.cuda_graph:
        from .graph import apply_chunked_embedding

        out.notes.append(apply_chunked_embedding(model.llm))
    if s.compile:
        from .compile import apply_compile, eval_context

        path = out.audio.path if out.audio is not None else None
        out.notes.append(apply_compile(model, s, plan.device, path))
        out.eval_context = eval_context(s)
    if s.sdpa_backends:
        out.notes.append(f"sdpa_backends: attention under sdpa_kernel({s.sdpa_backends}) for the whole run "
                         "(process-wide, restored after)")
    if plan.fused_adamw:
        out.notes.append("fused_adamw: fused AdamW; non-finite steps skipped on the device (found_inf), no sync")
    if s.optimizer_in_backward:
        out.notes.append("optimizer_in_backward: each decoder layer's fused AdamW update issued on a side stream as "
                         "soon as its gradients are final" + (" (clipped by the previous step's norm)"
                                                              if s.clip_by_previous_norm else ""))
    if s.fresh_grads:
        out.notes.append("fresh_grads: each step graph's backward writes new gradients (no zeroing pass, no add "
                         "into persistent buffers)")
    if s.label_head:
        from .label_head import apply_label_head

        out.loss, note = apply_label_head(s)
        out.notes.append(note)
    if s.liger_loss:
        from .llm_kernels import liger_loss

        out.loss = liger_loss()
        out.notes.append("liger_loss: LM head and cross-entropy fused by liger-kernel (no full logits)")
    if s.tf32:
        out.notes.append("tf32: TF32 matmuls/convolutions for fp32 work during training (process-wide, restored after)")
    return out


def _llm_kernels(model, plan: SpeedPlan) -> list[str]:
    """The LLM's Gated DeltaNet layers under packing (each packed conversation on its own, or
    flash-linear-attention's varlen kernels). Nothing for an LLM without such layers."""
    from .llm_kernels import (apply_fla_linear_attention, apply_linear_attention_batched,
                              apply_linear_attention_per_sequence, linear_attention_layers)

    s, notes = plan.speed, []
    if s.fla_kernels:
        notes.append(apply_fla_linear_attention(model))
    elif s.packing and s.linear_attention_batched:
        notes.append(apply_linear_attention_batched(model))
    elif s.packing and linear_attention_layers(model.llm):
        notes.append(apply_linear_attention_per_sequence(model))
    return notes
