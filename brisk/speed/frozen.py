"""speed.frozen_eval, speed.encoder_dtype and speed.encoder_cache: the frozen audio path, cheaply.

FunASR trains with model.train() on every module, so a frozen encoder and adaptor still run dropout
(numbers change from step to step) and the default keeps that. frozen_eval instead:
- keeps frozen modules in eval mode (no dropout): the loop puts the model in training mode through
  ``training_mode``, which leaves them in eval, and
- computes the audio rows for the step under torch.no_grad, outside the LLM's autograd graph.
encoder_dtype=bf16 runs bf16 copies of the frozen encoder and adaptor (about half the time; the probe
measures what it moves). The model keeps its fp32 originals, so checkpoints and exports carry exactly the
weights the run was given: a speed switch never changes what is saved (the copies cost half the fp32
encoder's memory on top). encoder_cache keeps each utterance's audio rows after the first time it is seen
and reuses them in later epochs. Trade-off: FunASR's front end dithers by default (fun_asr_nano.frontend.dither=1),
so with the cache an utterance keeps the dither of its first epoch; set dither=0 to make that exact.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import torch
from torch import nn

from ..formats.batch import AudioBatch


def training_mode(model: nn.Module, frozen_eval: bool) -> Callable[[], None]:
    """What the loop calls to put the model in training mode: ``model.train()``, then, under frozen_eval, the
    frozen modules back in eval mode."""
    frozen = _all_frozen(model) if frozen_eval else []

    def train() -> None:
        model.train()
        for m in frozen:
            m.eval()

    return train


def _all_frozen(model: nn.Module) -> list[nn.Module]:
    """The modules the config freezes that hold nothing trainable (a frozen LLM with LoRA adapters trains them,
    so it keeps its training mode and the adapters' dropout)."""
    return [m for m, f in model.freeze_plan().items() if f and not any(p.requires_grad for p in m.parameters())]


def apply_frozen_eval(model: nn.Module) -> str:
    frozen = _all_frozen(model)
    for m in frozen:
        m.eval()
    names = [n for n, m in model.named_children() if m in frozen]
    return f"frozen_eval: {', '.join(names) or 'nothing frozen'} in eval mode, audio rows computed without autograd"


class AudioPath(nn.Module):
    """Copies of the frozen audio modules in another dtype, computing the model's audio path.

    ``names``: the model family's audio modules (``Family.audio_path``), copied under the same names, so that the
    model class's own ``encode_audio`` and ``audio_rows`` run on the copies. Not a submodule of the model
    (nothing of it is saved or trained); always in eval mode.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype, names: tuple[str, ...]):
        super().__init__()
        self.kind, self.cfg, self.names = type(model), model.cfg, names
        self.originals = tuple(getattr(model, n) for n in names)  # a tuple: not registered as submodules
        for n, m in zip(names, self.originals):
            setattr(self, n, copy.deepcopy(m).to(dtype).eval())

    def encode_audio(self, speech: torch.Tensor, lengths: torch.Tensor, *args) -> torch.Tensor:
        return self.kind.encode_audio(self, speech, lengths, *args)

    def audio_rows(self, batch: AudioBatch) -> torch.Tensor:
        return self.kind.audio_rows(self, batch)

    def static_audio_inputs(self, batch: AudioBatch):
        return self.kind.static_audio_inputs(self, batch)

    def static_audio_rows(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.kind.static_audio_rows(self, *inputs)

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the originals' weights in again (after a resume loaded them), in place: graphs keep their pointers."""
        for src, dst in zip(self.originals, (getattr(self, n) for n in self.names)):
            theirs = src.state_dict()
            for k, v in dst.state_dict().items():
                v.copy_(theirs[k])


class FrozenAudio:
    """Provides the audio rows of a batch when the encoder and adaptor are frozen."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.float32, cache: bool = False,
                 names: tuple[str, ...] = ()):
        self.model, self.dtype = model, dtype
        # The module that computes the rows: the model itself in fp32, else copies (the originals stay fp32).
        self.path = model if dtype == torch.float32 else AudioPath(model, dtype, names)
        self.cache: dict[str, torch.Tensor] | None = {} if cache else None
        self.hits = self.misses = 0
        self.encoder: Callable[[AudioBatch], torch.Tensor] = self.path.audio_rows  # batch -> audio rows

    def with_encoder(self, encoder: Callable[[AudioBatch], torch.Tensor]) -> "FrozenAudio":
        """The same provider (same copies, same cache) computing its rows with ``encoder`` (the graphed step's
        encoder graphs); this one is left as it is."""
        other = copy.copy(self)
        other.encoder = encoder
        return other

    def refresh(self) -> None:
        """After the model's weights were loaded again (resume): recompute from them."""
        if isinstance(self.path, AudioPath):
            self.path.refresh()
        if self.cache is not None:
            self.cache.clear()

    @torch.no_grad()
    def __call__(self, batch: AudioBatch) -> torch.Tensor:
        if self.cache is not None and batch.keys and all(k in self.cache for k in batch.keys):
            self.hits += len(batch.keys)
            rows = torch.cat([self.cache[k] for k in batch.keys])
            pad = batch.audio_pos.numel() - rows.shape[0]
            return torch.cat([rows, rows.new_zeros(pad, rows.shape[1])]) if pad else rows
        rows = self._compute(batch)
        if self.cache is not None:
            self.misses += len(batch.keys)
            counts = batch.slot_counts
            for key, part in zip(batch.keys, rows[: sum(counts)].split(counts)):
                self.cache[key] = part.clone()
        return rows

    def _compute(self, batch: AudioBatch) -> torch.Tensor:
        if self.dtype != torch.float32:
            batch = dataclasses.replace(batch, speech=batch.speech.to(self.dtype))
        return self.encoder(batch)
