"""A plain causal LM for chat fine-tuning (``task: chat``), with the speech-LLM's interface minus the audio.

The training step, label_head, checkpoints and probe see what they see in a SpeechLLM: ``.llm`` (the
transformers causal LM), ``.cfg``, ``freeze_plan()`` and ``forward(batch, hidden=False)``
giving logits, or the last hidden states for speed.label_head. Its state dict is ``llm.*``; the HF export
is the LLM's own ``save_pretrained`` folder.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from ..formats.batch import Batch
from .lm import DTYPES, run_causal_lm


class ChatLM(nn.Module):
    def __init__(self, cfg: ModelConfig, llm: nn.Module):
        super().__init__()
        self.cfg = cfg
        self.llm_dtype = DTYPES[cfg.llm.dtype]
        self.llm = llm.to(self.llm_dtype)
        for module, frozen in self.freeze_plan().items():
            module.requires_grad_(not frozen)

    def freeze_plan(self) -> dict[nn.Module, bool]:
        return {self.llm: self.cfg.llm.freeze}

    def forward(self, batch: Batch, hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, vocab], or with ``hidden`` the decoder stack's last hidden states [B, T, D]. The step
        passes audio rows only to a model that has audio (they exist only there)."""
        embeds = self.llm.get_input_embeddings()(batch.input_ids)
        if hidden:
            return run_causal_lm(self.llm.base_model, embeds, batch, self.llm_dtype).last_hidden_state
        return run_causal_lm(self.llm, embeds, batch, self.llm_dtype).logits


