"""The speech-LLM: SANM encoder -> adaptor -> audio frames spliced into a causal LM's input embeddings.

A plain nn.Module with FunASR's FunASRNano parameter layout (``audio_encoder.*``, ``llm.*``,
``audio_adaptor.*``, optional ``ctc_decoder.*`` and ``ctc.*``), so FunASR checkpoints load with
``strict=True`` and checkpoints saved here load back into FunASR. It knows nothing of speed switches.
"""

from __future__ import annotations


import torch
from torch import nn

from ..config import ModelConfig
from ..formats.batch import AudioBatch, Batch
from .adaptor import CTCHead, TransformerAdaptor
from .lm import DTYPES, run_causal_lm
from .sanm import SANMEncoder





class SpeechLLM(nn.Module):
    def __init__(self, cfg: ModelConfig, llm: nn.Module):
        super().__init__()
        self.cfg = cfg
        fe = cfg.frontend
        self.audio_encoder = SANMEncoder(fe.n_mels * fe.lfr_m, cfg.encoder)
        self.llm = llm.to(DTYPES[cfg.llm.dtype])
        llm_dim = llm.get_input_embeddings().weight.shape[-1]
        ad = cfg.adaptor
        self.audio_adaptor = TransformerAdaptor(
            cfg.encoder.output_size, llm_dim, ad.ffn_dim, ad.n_layer, ad.attention_heads, ad.downsample_rate, ad.dropout_rate
        )
        self.ctc_decoder = self.ctc = None
        if cfg.ctc.enabled:
            c = cfg.ctc
            self.ctc_decoder = TransformerAdaptor(cfg.encoder.output_size, c.dim, c.ffn_dim, c.n_layer, 8, c.downsample_rate)
            self.ctc = CTCHead(c.dim, c.vocab_size)
        self.llm_dtype = DTYPES[cfg.llm.dtype]
        for module, frozen in self.freeze_plan().items():
            module.requires_grad_(not frozen)

    def freeze_plan(self) -> dict[nn.Module, bool]:
        plan = {self.audio_encoder: self.cfg.encoder.freeze, self.audio_adaptor: self.cfg.adaptor.freeze,
                self.llm: self.cfg.llm.freeze}
        if self.ctc_decoder is not None:
            plan[self.ctc_decoder] = self.cfg.ctc.freeze
            plan[self.ctc] = self.cfg.ctc.freeze
        return plan

    # ------------------------------------------------------------------------------------ audio path
    def encode_audio(self, speech: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """LFR frames [N, F, 560] -> adaptor outputs [N, F', llm_dim]."""
        enc, lens = self.audio_encoder(speech, lengths)
        out, _ = self.audio_adaptor(enc, lens)
        return out

    def audio_rows(self, batch: AudioBatch) -> torch.Tensor:
        """The adaptor frames that fill the batch's audio slots, [A, llm_dim]."""
        adapted = self.encode_audio(batch.speech, batch.speech_lengths)
        return adapted[batch.audio_utt, batch.audio_frame]

    # ---------------------------------------------------------------------------------- text + LLM
    def embed(self, batch: Batch, audio_rows: torch.Tensor | None) -> torch.Tensor:
        emb = self.llm.get_input_embeddings()(batch.input_ids)  # [B, T, D]
        if audio_rows is None or audio_rows.numel() == 0:
            return emb
        b, t, d = emb.shape
        # One scratch row past the end takes the padding slots (audio_pos == B*T), then is dropped.
        flat = torch.cat([emb.reshape(b * t, d), emb.new_zeros(1, d)])
        flat = flat.index_copy(0, batch.audio_pos, audio_rows.to(emb.dtype))
        return flat[:-1].view(b, t, d)

    def forward(self, batch: Batch, audio_rows: torch.Tensor | None = None, hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, vocab], or with ``hidden`` the final hidden states [B, T, D] (after the LLM's last norm,
        before lm_head). ``audio_rows`` may be given precomputed (a frozen or cached encoder). ``hidden`` is a
        forward argument, not only a method, so that a DDP-wrapped model can be asked for it too."""
        if hidden:
            return self.hidden_states(batch, audio_rows)
        return self._run_llm(self.llm, batch, audio_rows).logits

    def hidden_states(self, batch: Batch, audio_rows: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder stack's last hidden states [B, T, D]: what lm_head would turn into logits."""
        return self._run_llm(self.llm.base_model, batch, audio_rows).last_hidden_state

    def _run_llm(self, module: nn.Module, batch: Batch, audio_rows: torch.Tensor | None):
        """``module`` (the causal LM, or its decoder stack) on the batch's spliced embeddings."""
        if audio_rows is None and isinstance(batch, AudioBatch) and batch.speech is not None:
            audio_rows = self.audio_rows(batch)
        return run_causal_lm(module, self.embed(batch, audio_rows), batch, self.llm_dtype)
