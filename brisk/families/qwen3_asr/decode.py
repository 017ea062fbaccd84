"""Greedy decoding of Qwen3-ASR with brisk's Recognizer: the processor's features and prompt, the audio tower's
rows spliced at the audio tokens, the decoder's own ``generate`` (or the fast decoder).

The prompt is the training prefix (the chat template's system and audio turns, ``add_generation_prompt``), and
with data.language set, ``language <Name><asr_text>`` after it (the processor's ``apply_transcription_request``
forces a language the same way); the transcript is what follows ``<asr_text>``.
"""

from __future__ import annotations

import torch

from ...data.audio import read_audio
from .data import ASR_TEXT, Qwen3ASRPrompt, audio_token_count, features
from ...eval.decode import Recognizer
from ..registry import section


class Qwen3ASRRecognizer(Recognizer):
    def __init__(self, model, processor, *, device: torch.device | str = "cpu", language: str | None = None,
                 max_new_tokens: int = 512, fast: bool = False, fast_compile: str | None = None,
                 prefetch: bool | None = None, device_features: bool = False, fast_buckets: bool = False,
                 encoder_dtype: torch.dtype | None = None, fast_multi_step: bool = False):
        if encoder_dtype is not None:
            from ...config import ConfigError

            raise ConfigError("--encoder-bf16: Qwen3-ASR's audio tower runs in the dtype it was loaded in; "
                              "leave the option out")
        # Its features are the processor's (one utterance at a time, on the reading thread), and its fast decoder
        # keeps generate's shapes: device_features and fast_buckets are taken for the shared CLI and not used.
        self.device_features, self.fast_buckets, self._encode = False, False, None
        self.model, self.processor = model, processor
        self.tok = processor.tokenizer
        self.fe = processor.feature_extractor
        self.device = torch.device(device)
        self.fs = self.fe.sampling_rate
        self.prompter = Qwen3ASRPrompt(processor, language)
        self.prefill = f"language {language}{ASR_TEXT}" if language else ""
        self.max_new_tokens = max_new_tokens
        eos = model.hf_config.text_config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
        self.stop = sorted({*eos, *([self.tok.eos_token_id] if self.tok.eos_token_id is not None else [])})
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.stop[0]
        self.fast = fast or bool(fast_compile) or fast_multi_step
        self.fast_compile, self.fast_multi_step = fast_compile, fast_multi_step
        self._fast = None
        self.prefetch = self.device.type == "cuda" if prefetch is None else prefetch
        self.asr_text = self.tok.convert_tokens_to_ids(ASR_TEXT)

    def features(self, path: str) -> tuple[torch.Tensor, float]:
        wave = read_audio(path, self.fs)
        return features(self.fe, wave), wave.numel() / self.fs

    def prompt_ids(self, n_audio: int) -> list[int]:
        """The prompt of an utterance with ``n_audio`` audio rows: the training prefix under an empty system turn
        (``Qwen3ASRPrompt.system``), then the forced language, if any."""
        return self.tok(self.prompter.expand(self.prompter.prefix(""), n_audio) + self.prefill)["input_ids"]

    def prompt_embeds(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-mel features of each utterance -> the prompts' embeddings [B, T, D] with the audio rows spliced in,
        left padded with zeros, and their mask [B, T] (long)."""
        model = self.model
        speech = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True).to(self.device)  # [N, F, 128]
        lengths = torch.tensor([f.shape[0] for f in feats], device=self.device)
        rows = model.encode_audio(speech, lengths)  # [A, D], utterance after utterance
        embed = model.llm.get_input_embeddings()
        out, at = [], 0
        for f in feats:
            n = audio_token_count(f.shape[0], model.n_window)
            ids = self.prompt_ids(n)
            start = ids.index(self.prompter.audio_id)
            e = embed(torch.tensor(ids, device=self.device))  # [T_i, D]
            out.append(torch.cat([e[:start], rows[at:at + n].to(e.dtype), e[start + n:]]))
            at += n
        t = max(r.shape[0] for r in out)
        embeds = out[0].new_zeros(len(out), t, out[0].shape[1])
        mask = torch.zeros(len(out), t, dtype=torch.long, device=self.device)
        for i, r in enumerate(out):
            embeds[i, t - r.shape[0]:] = r
            mask[i, t - r.shape[0]:] = 1
        return embeds, mask

    def text(self, ids: list[int]) -> str:
        """The transcript: what follows <asr_text> (all of it when the language was prefilled), special tokens dropped."""
        if not self.prefill and self.asr_text in ids:
            ids = ids[ids.index(self.asr_text) + 1:]
        return " ".join(self.tok.decode(ids, skip_special_tokens=True).split())


def qwen3_asr_recognizer(cfg, model, tokenizer, device: str = "cpu", **kw) -> Qwen3ASRRecognizer:
    """The family's ``recognizer`` (`brisk eval`, `brisk transcribe`); the processor comes from the run's config."""
    from .data import load_processor

    return Qwen3ASRRecognizer(model, load_processor(cfg), device=device, language=section(cfg).language, **kw)


def qwen3_asr_val_recognizer(model, dataset, device, fast: bool = False) -> Qwen3ASRRecognizer:
    """The family's ``val_recognizer`` (train.val_decode), with the validation set's processor and language."""
    p = dataset.prompt
    return Qwen3ASRRecognizer(model, p.processor, device=device, language=p.language, fast=fast)
