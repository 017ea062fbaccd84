"""The speech-LLM: SANM encoder -> adaptor -> audio frames spliced into a causal LM's input embeddings.

A plain nn.Module with FunASR's FunASRNano parameter layout (``audio_encoder.*``, ``llm.*``,
``audio_adaptor.*``, optional ``ctc_decoder.*`` and ``ctc.*``), so FunASR checkpoints load with
``strict=True`` and checkpoints saved here load back into FunASR. It knows nothing of speed switches.
"""

from __future__ import annotations


import torch
from torch import nn

from ...config import ModelConfig
from .config import FunAsrNanoConfig
from ...formats.batch import AudioBatch
from .adaptor import CTCHead, TransformerAdaptor
from ...models.lm import DTYPES, SpeechLM
from .sanm import SANMEncoder





class SpeechLLM(SpeechLM):
    def __init__(self, cfg: ModelConfig, own: FunAsrNanoConfig, llm: nn.Module):
        """``cfg``: the shared model section (LLM dtype, what trains); ``own``: this family's sizes and front end."""
        super().__init__()
        self.cfg, self.own = cfg, own
        fe = own.frontend
        self.audio_encoder = SANMEncoder(fe.n_mels * fe.lfr_m, own.encoder)
        self.llm = llm.to(DTYPES[cfg.llm.dtype])
        llm_dim = llm.get_input_embeddings().weight.shape[-1]
        ad = own.adaptor
        self.audio_adaptor = TransformerAdaptor(
            own.encoder.output_size, llm_dim, ad.ffn_dim, ad.n_layer, ad.attention_heads, ad.downsample_rate, ad.dropout_rate
        )
        self.ctc_decoder = self.ctc = None
        if own.ctc.enabled:
            c = own.ctc
            self.ctc_decoder = TransformerAdaptor(own.encoder.output_size, c.dim, c.ffn_dim, c.n_layer, 8, c.downsample_rate)
            self.ctc = CTCHead(c.dim, c.vocab_size)
        self.llm_dtype = DTYPES[cfg.llm.dtype]
        for module, frozen in self.freeze_plan().items():
            module.requires_grad_(not frozen)

    def freeze_plan(self) -> dict[nn.Module, bool]:
        plan = {self.audio_encoder: self.cfg.encoder.freeze, self.audio_adaptor: self.cfg.adaptor.freeze,
                self.llm: self.cfg.llm.freeze}
        if self.ctc_decoder is not None:
            plan[self.ctc_decoder] = self.own.ctc.freeze
            plan[self.ctc] = self.own.ctc.freeze
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

    def static_audio_inputs(self, batch: AudioBatch) -> tuple[tuple, tuple[torch.Tensor, ...]]:
        """``audio_rows``'s inputs for the step graph with the audio path training (speed.cuda_graph): the
        speech padded to its bucket and the slots' indices, all fixed in shape by the speech and token buckets;
        their key (speech shape, slots)."""
        inputs = (batch.speech, batch.speech_lengths, batch.audio_utt, batch.audio_frame)
        return (tuple(batch.speech.shape), batch.audio_utt.numel()), inputs

    def static_audio_rows(self, speech: torch.Tensor, lengths: torch.Tensor, utt: torch.Tensor,
                          frame: torch.Tensor) -> torch.Tensor:
        return self.encode_audio(speech, lengths)[utt, frame]
