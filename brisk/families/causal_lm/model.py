"""A plain causal LM for chat fine-tuning (``model.family: causal_lm``), with the speech-LLM's interface minus
the audio.

The training step, label_head, checkpoints and probe see what they see in a SpeechLLM: ``.llm`` (the
transformers causal LM), ``.cfg``, ``freeze_plan()`` and ``forward(batch, hidden=False)``
giving logits, or the last hidden states for speed.label_head. Its state dict is ``llm.*``; the HF export
is the LLM's own ``save_pretrained`` folder.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...config import ModelConfig
from ...formats.batch import Batch
from ...models.build import after_loading, build_llm, has_hf_weights, load_hf_llm_weights, load_weights, with_adapters
from ...models.lm import DTYPES, run_causal_lm


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


def build_chat_model(cfg: ModelConfig, device: torch.device | str | None = None) -> ChatLM:
    """A ChatLM: seeded random initialisation (from model.llm.config, or model.llm.path's config.json), LoRA
    adapters (model.llm.lora), then the folder's *.safetensors (when model.llm.load_weights), then model.init (a
    brisk checkpoint or .safetensors), then activation checkpointing (model.llm.activation_checkpoint).

    On a GPU (and on meta) the weights are made in model.llm.dtype directly: fp32 first would need twice the
    memory before the cast (a 27B model's fp32 copy alone nearly fills one H200). On the CPU they are made in
    fp32 and cast, as before: there torch's bf16 normal_ draws other values than fp32's, and the CPU runs are the
    ones whose numbers tests compare."""
    torch.manual_seed(cfg.seed)
    direct = torch.device(device or "cpu").type in ("cuda", "meta")
    with torch.device(device or "cpu"):
        model = with_adapters(ChatLM(cfg, build_llm(cfg, DTYPES[cfg.llm.dtype] if direct else None)), cfg)
    if cfg.llm.path and cfg.llm.load_weights and has_hf_weights(Path(cfg.llm.path)):
        load_hf_llm_weights(model, Path(cfg.llm.path))
    if cfg.init:
        load_weights(model, Path(cfg.init))
    return after_loading(model, cfg)
