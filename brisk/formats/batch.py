"""The batches that flow from collation to the model, in one of two layouts.

padded: B rows of tokens, right-padded to the longest, with an attention mask (FunASR's layout).
packed: one row holding every sequence back to back, per-sequence position_ids and cumulative sequence
        lengths (cu_seqlens) for variable-length attention, padded up to a bucket length so that the set of
        shapes is small and known in advance.

``Batch`` is the shared core every family's batch has (ids, labels, mask or positions and cu_seqlens, and the
host-side counts): what the step, the loss, the packing code and the timer read. A text family's batch is just
that. ``AudioBatch`` is an audio family's: the core plus the features and the slots they fill. Audio reaches
the LLM through three index vectors instead of FunASR's per-utterance Python loop, so that the splice needs no
host sync: slot i takes adaptor frame ``audio_frame[i]`` of audio segment ``audio_utt[i]`` and writes it at
flat token position ``audio_pos[i]`` (B*T means "nowhere": padding that keeps the number of slots static).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] int64
    labels: torch.Tensor  # [B, T] int64, -100 where no loss (unshifted: labels[t] is the token at t)
    attention_mask: torch.Tensor | None = None  # [B, T] int64 (padded layout)
    position_ids: torch.Tensor | None = None  # [1, T] int64 (packed layout)
    cu_seqlens: torch.Tensor | None = None  # [S+1] int32 (packed layout)
    layout: str = "padded"
    keys: list[str] = field(default_factory=list)
    # Host-side facts, known without touching the device (for the step timer and slow-step detector).
    n_utts: int = 0
    n_tokens: int = 0  # real LLM tokens
    n_label_tokens: int = 0
    label_rows_floor: int = 0  # several ranks: the most labelled positions any rank's batch has this step (ShapeSync)
    bad: list[str] = field(default_factory=list)  # samples skipped under data.skip_bad
    notes: list[tuple[str, str]] = field(default_factory=list)  # audio conversions of its samples (resampled, down-mixed)
    # [T / 64, 2] int64: each 64-token chunk's (sequence, chunk within it), for fla's Gated DeltaNet kernels, which
    # otherwise work it out from cu_seqlens on the host; only on a packed row whose sequences start at multiples
    # of 64 (Collator(align=64), speed.cuda_graph with Gated DeltaNet layers)
    chunk_indices: torch.Tensor | None = None

    @property
    def shape(self) -> dict:
        b, t = self.input_ids.shape
        return {"layout": self.layout, "rows": b, "len": t, "utts": self.n_utts, "tokens": self.n_tokens,
                "label_tokens": self.n_label_tokens}

    def shape_key(self) -> tuple:
        """Everything that decides tensor shapes in the step: a new key means new kernels/plans/graphs."""
        return (self.layout, *self.input_ids.shape)

    def _map(self, fn) -> "Batch":
        changes = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                changes[f.name] = fn(v)
        return dataclasses.replace(self, **changes)

    def to(self, device, non_blocking: bool = False) -> "Batch":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":  # called by DataLoader(pin_memory=True)
        return self._map(lambda t: t.pin_memory())


@dataclass
class AudioBatch(Batch):
    audio_utt: torch.Tensor | None = None  # [A] int64
    audio_frame: torch.Tensor | None = None  # [A] int64
    audio_pos: torch.Tensor | None = None  # [A] int64
    speech: torch.Tensor | None = None  # [N, F, D_feat] float32, zero-padded LFR frames
    speech_lengths: torch.Tensor | None = None  # [N] int64
    slot_counts: list[int] = field(default_factory=list)  # audio slots of each utterance, in order
    speech_frames: int = 0  # real LFR frames

    @property
    def shape(self) -> dict:
        out = {**super().shape, "speech_frames": self.speech_frames}
        if self.speech is not None:
            out["speech_shape"] = list(self.speech.shape[:2])
        return out

    def shape_key(self) -> tuple:
        sp = tuple(self.speech.shape[:2]) if self.speech is not None else ()
        return (*super().shape_key(), *sp, int(self.audio_pos.numel()))
