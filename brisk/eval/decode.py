"""Greedy decoding with a KV cache and FunASR 1.4.16's inference prompt.

The prompt is the one ``FunASRNano.inference`` builds (``get_prompt`` + ``generate_chatml``), not the jsonl's:

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n
    语音转写：<|startofspeech|>[audio slots]<|endofspeech|><|im_end|>\\n<|im_start|>assistant\\n

with ``语音转写成{language}`` when a language is given and ``，不进行文本规整`` before the colon when itn is off;
no context header (FunASR's inference adds none). ``data.sys_prompt=false`` drops the system turn and
``data.do_think=false`` appends ``<think>\\n\\n</think>\\n\\n``, as FunASR's inference reads them from
dataset_conf. The text pieces are tokenized one by one, as FunASR does, and the audio slots take the first
``audio_token_count(L)`` adaptor outputs.

Decoding is the LLM's own ``generate(inputs_embeds=...)``: greedy, KV cache, stopping at the LLM config's
eos and at ``<|im_end|>``. Several utterances decode together, left-padded (FunASR's batched path does the
same); positions then come from the attention mask, so each utterance's tokens keep positions 0, 1, 2, ...

With ``fast=True`` the same prompt embeddings go to brisk.eval.fast_decode.FastGreedy instead (static KV cache,
the decode step a CUDA graph on CUDA); it gives the same ids (tests/test_decode_parity.py).

The family hands over its features (Fun-ASR-Nano's fbank + LFR front end, without dither: FunASR's dithers
unless its config sets dither: 0), so a transcript is the same on every run; by default for a whole batch at once
on the decoding device (``frontend.batch``: the same fbank + LFR + CMVN equations as torch ops),
``device_features=False`` one utterance at a time on the CPU, as the training loader does.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from ..data.audio import read_audio
from ..families import family_of
from ..formats.funasr import audio_token_count

SYSTEM = "You are a helpful assistant."  # FunASR's generate_chatml


def _cores() -> int:
    """The cores this process may run on (a container's CPU set, where the OS says it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Threads that read one batch's audio files: every core but one (the decoding thread's), at least 2, at most 32.
READERS = max(2, min(32, _cores() - 1))
_SPLIT = re.compile(r"(<\|startofspeech\|>.*?<\|endofspeech\|>)")


def inference_prompt(hotwords: list[str] | tuple = (), language: str | None = None, itn: bool = True) -> str:
    """FunASR 1.4.16's ``FunASRNano.get_prompt``, string for string."""
    prompt = ""
    if hotwords:
        prompt = ("请结合上下文信息，更加准确地完成语音转写任务。如果没有相关信息，我们会留空。\n\n\n**上下文信息：**\n\n\n"
                  f"热词列表：[{', '.join(hotwords)}]\n")
    prompt += "语音转写" if language is None else f"语音转写成{language}"
    if not itn:
        prompt += "，不进行文本规整"
    return prompt + "："


@dataclass
class Result:
    ids: list[int]  # generated token ids, up to (not including) the stop token
    text: str
    audio_seconds: float


class Recognizer:
    """Audio files (or LFR features) -> token ids and text, with a SpeechLLM and its tokenizer."""

    # Defaults here, not only in __init__: a family's recognizer may build itself without Recognizer.__init__.
    encoder_dtype: torch.dtype | None = None
    # The fast decoder's own step (fused projections, attention over the filled slots) where the LLM allows it;
    # False: the LLM's forward a token (the reference arm of bench/decode_bench.py).
    fast_fused = True
    # Concatenated q/k/v and gate/up GEMMs in that step: None, only when compiled (brisk.eval.fast_decode).
    fast_fuse: bool | None = None
    fast_multi_step = False
    _audio = None  # the encoder and adaptor copied in encoder_dtype (``audio_path``), made on first use
    _readers: ThreadPoolExecutor | None = None  # the threads that read a batch's audio files (``read``)

    def __init__(self, model, tokenizer, frontend, *, device: torch.device | str = "cpu", sys_prompt: bool = True,
                 do_think: bool = True, prompt: str | None = None, max_new_tokens: int = 512, fast: bool = False,
                 fast_compile: str | None = None, prefetch: bool | None = None, device_features: bool = True,
                 fast_buckets: bool = False, encoder_dtype: torch.dtype | None = None, fast_multi_step: bool = False):
        self.model, self.tok = model, tokenizer
        self.device = torch.device(device)
        self.frontend = frontend  # the family's features: frontend(wave) and frontend.batch(waves, device)
        self.fs = frontend.cfg.fs
        self.sys_prompt, self.do_think = sys_prompt, do_think
        self.prompt = prompt if prompt is not None else inference_prompt()
        self.max_new_tokens = max_new_tokens
        self.low_frame_rate = model.own.adaptor.use_low_frame_rate
        llm_cfg = model.llm.config
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        eos = llm_cfg.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
        self.stop = sorted({*eos, *([im_end] if isinstance(im_end, int) and im_end >= 0 else [])})
        self.pad = llm_cfg.pad_token_id if llm_cfg.pad_token_id is not None else (self.stop[0] if self.stop else 0)
        self.fast = fast or bool(fast_compile) or fast_buckets or fast_multi_step
        # One graph replay makes the tokens of one finished-mask check (brisk.eval.fast_decode, multi_step).
        self.fast_multi_step = fast_multi_step
        # The encoder and the prefill replayed from graphs per length bucket (brisk.eval.fast_decode, buckets).
        self.fast_buckets = fast_buckets
        self.fast_compile = fast_compile  # a torch.compile backend for the fast decoder's step ("inductor")
        self._fast = None  # the FastGreedy decoder, built on first use
        self._encode = None  # fast on CUDA: the encoder's graphs (brisk.eval.fast_decode.GraphedEncode)
        # The encoder and adaptor as copies in another dtype (--encoder-bf16: the LLM's bf16, as training's
        # speed.encoder_dtype runs them; its features change in the last bits, so transcripts may too); None:
        # the model's own modules.
        self.encoder_dtype = encoder_dtype
        self._prompts: dict[int, tuple[list[int], int]] = {}  # prompt ids and first audio slot, by audio slot count
        # Features of the next batches on a thread while this one decodes; by default on CUDA only (on the CPU
        # the thread would take the cores the decoder uses).
        self.prefetch = self.device.type == "cuda" if prefetch is None else prefetch
        # Features of a whole batch at once on the decoding device (Frontend.batch); False: one utterance at a
        # time on the CPU thread that reads the audio (the training loader's path).
        self.device_features = device_features

    def release(self) -> None:
        """Give back the fast decoder's caches, buffers and CUDA graphs (built again on the next decode)."""
        if self._fast is not None:
            self._fast.release()
            self._fast = None
        self._encode = None
        self._audio = None
        if self._readers is not None:
            self._readers.shutdown()  # idle threads: joined at once, none left when training forks its loaders
            self._readers = None

    def audio_path(self):
        """What encodes the audio: the model, or its encoder and adaptor copied in ``encoder_dtype``."""
        names = family_of(self.model.cfg).audio_path  # the modules training's speed.encoder_dtype copies
        first = getattr(self.model, names[0])
        if self.encoder_dtype is None or self.encoder_dtype == next(first.parameters()).dtype:
            return self.model
        if self._audio is None:
            import logging

            from ..speed.frozen import AudioPath

            self._audio = AudioPath(self.model, self.encoder_dtype, names)
            logging.getLogger("brisk").info("decoding: the encoder and adaptor run as %s copies",
                                            str(self.encoder_dtype).replace("torch.", ""))
        return self._audio

    # ------------------------------------------------------------------------------------- prompt
    def prompt_ids(self, n_audio: int) -> tuple[list[int], int]:
        """Token ids of the inference prompt with ``n_audio`` placeholder slots, and the first slot's index."""
        user = f"{self.prompt}<|startofspeech|>!audio<|endofspeech|>"
        source = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        if self.sys_prompt:
            source = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" + source
        if not self.do_think:
            source += "<think>\n\n</think>\n\n"
        ids: list[int] = []
        start = -1
        for piece in _SPLIT.split(source):
            if piece.startswith("<|startofspeech|>"):
                start = len(ids)
                ids += [0] * n_audio
            else:
                ids += list(self.tok.encode(piece))
        return ids, start

    # ------------------------------------------------------------------------------------ decoding
    def read(self, paths: list[str]) -> list[torch.Tensor]:
        """The waveforms of ``paths``, in order, read on up to READERS threads: decoding compressed audio (ogg,
        flac) is CPU work that soundfile does without the GIL, and read one by one a large batch's files can take
        as long as its GPU decode (bench/decode_bench.py times it)."""
        if len(paths) < 2 or READERS < 2:
            return [read_audio(p, self.fs) for p in paths]
        if self._readers is None:  # kept for the next batches: no threads started and joined each batch
            self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="brisk-read")
        return list(self._readers.map(lambda p: read_audio(p, self.fs), paths))

    def features(self, path: str) -> tuple[torch.Tensor, float]:
        wave = read_audio(path, self.fs)
        return self.frontend(wave), wave.numel() / self.fs

    @torch.no_grad()
    def decode_features(self, feats: list[torch.Tensor], max_new_tokens: int | None = None) -> list[list[int]]:
        """LFR features [F, D] of each utterance -> generated ids of each, decoded together (left padding)."""
        with self._eval_mode():
            return self._decode(feats, max_new_tokens)

    @torch.no_grad()
    def decode_speech(self, speech: torch.Tensor, lengths: torch.Tensor, max_new_tokens: int | None = None) -> list[list[int]]:
        """Padded LFR features [N, F, D] and their lengths [N] -> generated ids of each utterance."""
        with self._eval_mode():
            return self._decode((speech, lengths), max_new_tokens)

    @contextmanager
    def _eval_mode(self):
        """No dropout while decoding; a training model's modes are restored after, module by module (training's
        speed.frozen_eval keeps frozen modules in eval mode inside a model in train mode). A model already in
        eval mode (brisk eval, transcribe: load_for_inference put every module there) is left as it is: switching
        a Fun-ASR-Nano's modules there and back walks its whole module tree twice a batch."""
        model = self.model
        if not model.training:
            yield
            return
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            yield
        finally:
            for m, training in modes:
                m.training = training

    def _decode(self, feats, max_new_tokens: int | None) -> list[list[int]]:
        embeds, mask = self.prompt_embeds(feats)
        out = self.generate(embeds, mask, max_new_tokens or self.max_new_tokens)
        results = []
        for row in out.tolist():  # with inputs_embeds only, generate returns the new tokens alone
            cut = next((j for j, x in enumerate(row) if x in self.stop), len(row))
            results.append(row[:cut])
        return results

    def generate(self, embeds: torch.Tensor, mask: torch.Tensor, max_new: int) -> torch.Tensor:
        """Greedy ids [B, <= max_new] of left-padded prompt embeddings: the LLM's generate, or the fast decoder."""
        dtype = self.model.llm_dtype
        if self.fast:
            if self._fast is None:
                from .fast_decode import FastGreedy

                self._fast = FastGreedy(self.model.llm, self.stop, self.pad, dtype, self.device,
                                        compile=self.fast_compile, buckets=self.fast_buckets, fused=self.fast_fused,
                                        fuse=self.fast_fuse, multi_step=self.fast_multi_step)
            return self._fast.generate(embeds.to(dtype), mask, max_new)
        autocast = torch.autocast(self.device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
        with autocast:
            return self.model.llm.generate(inputs_embeds=embeds.to(dtype), attention_mask=mask, do_sample=False,
                                           num_beams=1, max_new_tokens=max_new, eos_token_id=self.stop or None,
                                           pad_token_id=self.pad)

    def prompt_embeds(self, feats) -> tuple[torch.Tensor, torch.Tensor]:
        """LFR features of each utterance (a list of [F_i, D], or padded [N, F, D] with lengths [N]) -> the
        prompts' embeddings [B, T, D] with the audio spliced in, left padded with zeros, and their mask [B, T]
        (long)."""
        if isinstance(feats, tuple):
            speech, lengths = feats[0].to(self.device), feats[1].to(self.device)
        else:
            speech = pad_sequence(feats, batch_first=True).to(self.device)  # [N, F, D]
            lengths = torch.tensor([f.shape[0] for f in feats], device=self.device)
        return self.splice(self.encode(speech, lengths), lengths.tolist())

    def encode(self, speech: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Padded LFR features [N, F, D] -> adaptor outputs [N, F', llm_dim]; with fast_buckets on CUDA, replayed
        from a graph per batch and frame bucket (brisk.eval.fast_decode.GraphedEncode)."""
        path = self.audio_path()
        if path is not self.model:
            speech = speech.to(self.encoder_dtype)
        if self.fast_buckets and self.device.type == "cuda":
            if self._encode is None:
                from .fast_decode import GraphedEncode

                self._encode = GraphedEncode(path, self.device)
            return self._encode(speech, lengths)
        return path.encode_audio(speech, lengths)

    def splice(self, adapted: torch.Tensor, frames: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Adaptor outputs [N, F', D] of utterances of ``frames`` LFR frames -> left-padded prompt embeddings
        [N, T, D] (zeros at padding) and mask [N, T]: one embedding lookup and one scatter for the batch."""
        rows = []
        for f in frames:
            n = audio_token_count(f, self.low_frame_rate)
            if n not in self._prompts:
                self._prompts[n] = self.prompt_ids(n)
            rows.append((self._prompts[n], n))
        t = max(len(ids) for (ids, _), _ in rows)
        ids = torch.zeros(len(rows), t, dtype=torch.long)
        mask = torch.zeros(len(rows), t, dtype=torch.long)
        audio = torch.zeros(len(rows), t, dtype=torch.bool)
        for i, ((row, start), n) in enumerate(rows):
            pad = t - len(row)
            ids[i, pad:] = torch.tensor(row)
            mask[i, pad:] = 1
            audio[i, pad + start: pad + start + n] = True
        ids, mask, audio = (x.to(self.device, non_blocking=True) for x in (ids, mask, audio))
        embeds = self.model.llm.get_input_embeddings()(ids)  # [N, T, D]
        # Each row's first n adaptor outputs, in order, into its audio slots (row-major, as ``audio`` is).
        keep = torch.arange(adapted.shape[1], device=self.device)[None, :] < torch.tensor(
            [n for _, n in rows], device=self.device)[:, None]
        embeds = embeds.masked_scatter(audio[..., None], adapted[keep].to(embeds.dtype))
        embeds = embeds.masked_fill(mask[..., None] == 0, 0.0)  # zeros at padding, as the per-row build had
        return embeds, mask

    def text(self, ids: list[int]) -> str:
        """FunASR's post-processing: special tokens dropped, /sil and runs of whitespace to one space."""
        t = self.tok.decode(ids, skip_special_tokens=True)
        return re.sub(r"\s+", " ", t.replace("/sil", " ")).strip()

    def transcribe(self, paths: list[str], batch_size: int = 8, max_new_tokens: int | None = None) -> list[Result]:
        chunks = [paths[b:b + batch_size] for b in range(0, len(paths), batch_size)]
        return [r for results in self.transcribe_batches(chunks, max_new_tokens) for r in results]

    def transcribe_batches(self, chunks: list[list[str]], max_new_tokens: int | None = None):
        """Yield the Results of each chunk of audio paths, decoded together; the next chunk's audio is read (and
        featurized) on a thread while this one decodes (``prefetch``)."""
        def load(chunk: list[str]) -> tuple[tuple[torch.Tensor, ...], tuple[float, ...]]:
            if self.device_features:  # only the audio here; its features are computed for the batch at once
                waves = self.read(chunk)
                return tuple(waves), tuple(w.numel() / self.fs for w in waves)
            return tuple(zip(*(self.features(p) for p in chunk)))

        with ThreadPoolExecutor(1) if self.prefetch and len(chunks) > 1 else nullcontext() as pool:
            for got, secs in (one_ahead(pool, load, chunks) if pool is not None else map(load, chunks)):
                if self.device_features:
                    ids = self.decode_speech(*self.frontend.batch(list(got), self.device), max_new_tokens)
                else:
                    ids = self.decode_features(list(got), max_new_tokens)
                yield [Result(i, self.text(i), s) for i, s in zip(ids, secs)]


def one_ahead(pool: ThreadPoolExecutor, fn, items: list):
    """``fn`` over ``items`` with the next item's call running on ``pool`` while the caller uses this one's
    result: a thread reads and featurizes the next batch (the fbank's torch ops release the GIL) while the GPU
    decodes, and only one batch is ever read ahead (a long eval set is never held in memory whole)."""
    pending = pool.submit(fn, items[0]) if items else None
    for i in range(len(items)):
        result = pending.result()
        pending = pool.submit(fn, items[i + 1]) if i + 1 < len(items) else None
        yield result


def timed_transcribe(rec: Recognizer, paths: list[str], batch_size: int = 8,
                     max_new_tokens: int | None = None) -> tuple[list[Result], float]:
    """Transcripts and the wall time of the whole decode (audio reading and features included)."""
    t0 = time.perf_counter()
    results = rec.transcribe(paths, batch_size, max_new_tokens)
    if rec.device.type == "cuda":
        torch.cuda.synchronize(rec.device)
    return results, time.perf_counter() - t0
