"""Speed switches, each applied from outside the plain model by one function that says what it did.

``apply_speed`` runs the model-side switches in a fixed order and returns a ``SpeedPlan``: the notes to
log, the pieces the training step takes (attention scope, frozen audio provider, loss hook), how to build the
optimizer, and how to collate batches. With every switch off it returns an empty plan: nothing touched.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from ..config import Config, ConfigError
from ..data.collate import Collator
from .frozen import FrozenAudio, apply_frozen_eval


@dataclass
class SpeedPlan:
    notes: list[str] = field(default_factory=list)
    context: Callable[[], ContextManager] = nullcontext
    audio: FrozenAudio | None = None
    fused_adamw: bool = False
    capturable: bool = False
    on_device_skip: bool = False
    collator: Collator = field(default_factory=Collator)
    loss: Callable | None = None  # StepHooks.loss (speed.label_head)


def collator_for(cfg: Config) -> Collator:
    s = cfg.speed
    if not s.packing:
        return Collator()
    return Collator(packed=True, token_buckets=tuple(s.pack_buckets), speech_buckets=tuple(s.speech_buckets),
                    pad_utts=cfg.data.max_utts if s.cuda_graph else 0, static=s.cuda_graph)


def apply_speed(model, cfg: Config, device: torch.device) -> SpeedPlan:
    s = cfg.speed
    plan = SpeedPlan(collator=collator_for(cfg))
    if s.cuda_graph:
        if device.type != "cuda":
            raise ConfigError("speed.cuda_graph needs a CUDA device")
        if cfg.train.accum_grad != 1:
            raise ConfigError("speed.cuda_graph does not support train.accum_grad > 1")
        if not s.frozen_eval:
            raise ConfigError("speed.cuda_graph needs speed.frozen_eval=true (the graphed step covers the LLM; "
                              "the frozen encoder and adaptor run in graphs of their own)")
    if s.frozen_eval:
        plan.notes.append(apply_frozen_eval(model))
        dtype = torch.bfloat16 if s.encoder_dtype == "bf16" else torch.float32
        plan.audio = FrozenAudio(model, dtype, cache=s.encoder_cache)
        if dtype != torch.float32:
            plan.notes.append("encoder_dtype: frozen encoder and adaptor run as bf16 copies (the fp32 originals are saved)")
        if s.encoder_cache:
            plan.notes.append("encoder_cache: audio rows kept per utterance and reused in later epochs")
    elif s.encoder_dtype != "fp32":
        raise ConfigError("speed.encoder_dtype=bf16 needs speed.frozen_eval=true")
    if s.packing:
        if device.type == "cuda":
            from .varlen import apply_varlen_attention

            plan.notes.append(apply_varlen_attention(model.llm))
        else:
            plan.notes.append("packing: one row per batch; CPU attention gets transformers' block-diagonal mask")
    if s.fuse_projections:  # before compile: the compiled layers trace the fused forwards
        if cfg.train.parallel == "fsdp":
            raise ConfigError("speed.fuse_projections with train.parallel=fsdp is not tested; use one of them")
        from .fuse import apply_fuse_projections

        plan.notes.append(apply_fuse_projections(model.llm))
    if s.compile:
        from .compile import apply_compile

        plan.notes.append(apply_compile(model, s, plan.audio.path.audio_encoder if plan.audio is not None else None))
    if s.sdpa_backends:
        from .sdpa import sdpa_scope

        plan.context = sdpa_scope(s.sdpa_backends)
        plan.notes.append(f"sdpa_backends: forward and backward under sdpa_kernel({s.sdpa_backends}) "
                          "(process-wide while the step runs, restored after)")
    if s.fused_adamw or s.cuda_graph:
        plan.fused_adamw = plan.on_device_skip = True
        plan.notes.append("fused_adamw: fused AdamW; non-finite steps skipped on the device (found_inf), no sync")
    if s.cuda_graph:
        plan.capturable = True
    if s.fresh_grads:
        plan.notes.append("fresh_grads: each step graph's backward writes new gradients (no zeroing pass, no add "
                          "into persistent buffers)")
    if s.label_head:
        from .label_head import apply_label_head

        plan.loss, note = apply_label_head(cfg)
        plan.notes.append(note)
    if s.tf32:
        plan.notes.append("tf32: TF32 matmuls/convolutions for fp32 work during training (process-wide, restored after)")
    return plan
