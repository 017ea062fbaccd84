"""The written contract between a model family and the general rooms: what the model its ``build`` returns must
answer. The step, label_head, the speed switches, LoRA, FSDP and export call exactly these; nothing else of a
family's model is read from outside it. ``runtime_checkable``: ``isinstance`` checks the names (a test builds every
registered family's model and checks it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: this floor imports no torch
    import torch
    from torch import nn

    from ..config import ModelConfig
    from ..formats.batch import AudioBatch, Batch


@runtime_checkable
class FamilyModel(Protocol):
    """Every family's model."""

    cfg: ModelConfig
    llm: nn.Module  # a transformers causal LM: its base_model.layers are the decoder layers, its lm_head the head

    def freeze_plan(self) -> dict[nn.Module, bool]:
        """Each top-level module and whether it is frozen (requires_grad off), from the config."""

    def forward(self, batch: Batch, hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, vocab], or with ``hidden`` the final hidden states [B, T, D] (label_head's input). A speech
        family's forward also takes ``audio_rows=`` (the frozen path's precomputed rows)."""


@runtime_checkable
class SpeechModel(FamilyModel, Protocol):
    """A family whose batches carry audio (AudioBatch): its audio path on top."""

    def encode_audio(self, speech: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Padded features [N, F, dim] and their lengths -> the audio path's outputs."""

    def audio_rows(self, batch: AudioBatch) -> torch.Tensor:
        """The rows that fill the batch's audio slots (``AudioBatch.audio_pos``), in slot order: [A, llm_dim]."""
