"""Qwen3-ASR's training samples: its processor's prompt and features, the official recipe's labels.

QwenLM/Qwen3-ASR finetuning/qwen3_asr_sft.py (the anchor) trains on jsonl lines ``{"audio": path, "text":
"language English<asr_text>..."}`` (``prompt``: an optional system text). Its collator renders the system turn and
the audio turn with the processor's chat template (``add_generation_prompt=True``), appends the target text and
the tokenizer's eos token, runs the processor (which expands the one audio token into one per audio-tower output
row), and masks the prefix (its token count from the prefix alone) and every pad id. Here each sample is built
that way on its own, so a row's labels are the recipe's for that row, with two exceptions where the recipe is
wrong (tests/test_qwen3_asr.py shows both):

- the recipe's processor pads rows on the left, but it masks ``labels[i, :prefix_len]`` from the left edge: on
  every row shorter than the batch's longest, the last (longest - own length) prefix tokens keep labels (the
  audio tokens and ``<|im_start|>assistant``); here no prefix token is labelled;
- when the tokenizer's pad token is its eos token, ``labels[labels == pad_id] = -100`` also masks the eos that
  ends the target, so the model never learns to stop; here the final eos keeps its label.

FunASR jsonl lines (a ``<|startofspeech|>!path<|endofspeech|>`` user turn, the transcript as the assistant turn)
become ``language <qwen3_asr.language><asr_text><transcript>`` targets (``language None`` without it), the
recipe's advice for data without a language, under an empty system turn: the prefix decoding uses
(``Qwen3ASRPrompt.system``).

Features: the processor's feature extractor on each utterance alone (128-bin log-mel, no dither), its valid
frames only; the model pads them to whole windows of 2 * n_window frames.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import ConfigError, DataError
from ...data.audio import AudioError, read_audio
from ...data.collate import example_rows
from ...data.dataset import Sample
from ...data.jsonl import Utterance, decode_line, not_speech_format, read_jsonl
from ...data.prompt import Tokens
from ..registry import section

ASR_TEXT = "<asr_text>"


def load_processor(cfg):
    """The Qwen3-ASR processor (tokenizer, feature extractor, chat template) of data.tokenizer or model.llm.path."""
    from transformers import AutoProcessor

    path = cfg.data.tokenizer or cfg.model.llm.path
    if not path:
        raise ConfigError("data.tokenizer: give a Qwen3-ASR processor folder (or model.llm.path that holds one)")
    processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    if not hasattr(processor, "feature_extractor") or not getattr(processor.tokenizer, "audio_token", None):
        raise ConfigError(f"data.tokenizer={path}: not a Qwen3-ASR processor folder (no feature extractor or no "
                          "audio token); tools/make_qwen3_asr_processor.py makes a tiny one")
    return processor


def target_text(utt: Utterance, language: str | None) -> str:
    """The text the model learns after the prompt: the recipe line's own, or FunASR's transcript with a prefix."""
    if "target" in utt.context:
        return utt.context["target"]
    return f"language {language or 'None'}{ASR_TEXT}{utt.assistant[0]}"


def transcript(text: str) -> str:
    """The transcript part of a target ("language English<asr_text>hello" -> "hello")."""
    return text.split(ASR_TEXT, 1)[1] if ASR_TEXT in text else text


def read_recipe_jsonl(path: str | Path, skip_bad: bool) -> tuple[list[Utterance], list[str]]:
    """The official recipe's jsonl: {"audio": path, "text": target, "prompt": optional system text}."""
    import soundfile as sf

    path = Path(path)
    utts, skipped = [], []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{path}:{n}"
            try:
                obj = json.loads(decode_line(raw, where))
                if not isinstance(obj, dict) or not isinstance(obj.get("audio"), str) or not isinstance(obj.get("text"), str):
                    raise DataError(f"{where}: expected {{\"audio\": path, \"text\": \"language X<asr_text>...\"}}")
                audio = Path(obj["audio"]).expanduser()
                audio = audio if audio.is_absolute() else path.parent / audio
                if not audio.is_file():
                    raise DataError(f"{where}: audio file {audio} does not exist")
                info = sf.info(str(audio))
                frames = int(info.frames * 100 / info.samplerate)  # 10 ms frames, for batching by length
                text = obj["text"]
                utts.append(Utterance(str(obj.get("key", where)), where, [obj.get("prompt") or ""],
                                      [f"<|startofspeech|>!{audio}<|endofspeech|>"], [transcript(text)], [None],
                                      frames, len(text), {"target": text, "system": obj.get("prompt") or ""}))
            except (DataError, ValueError, RuntimeError) as e:
                message = str(e) if isinstance(e, DataError) else f"{where}: {e}"
                if not skip_bad:
                    raise DataError(message, "lines") from None
                skipped.append(message)
    if not utts:
        raise DataError(f"{path}: no usable utterances")
    return utts, skipped


def read_lines(path: str, cfg) -> tuple[list[Utterance], list[str]]:
    """Either jsonl: the recipe's ({"audio", "text"}) or FunASR's ({"messages": ...}), told by the first line."""
    if not_speech_format(Path(path)):
        raise DataError(not_speech_format(Path(path)))
    with open(path, "rb") as f:
        first = next((line for line in f if line.strip()), b"{}")
    try:
        recipe = "messages" not in json.loads(first)
    except ValueError:
        recipe = False  # FunASR's reader names the line
    if recipe:
        return read_recipe_jsonl(path, cfg.data.skip_bad)
    d = cfg.data
    index = read_jsonl(path, max_speech_length=d.max_speech_length, max_text_length=d.max_text_length, skip_bad=d.skip_bad)
    return index.utterances, index.skipped


@dataclass
class Qwen3ASRPrompt:
    """One utterance -> the recipe's token ids and labels (brisk's two fixes, above)."""

    processor: object
    language: str | None = None

    def __post_init__(self):
        self.tok = self.processor.tokenizer
        self.audio_token = self.tok.audio_token
        self.audio_id = self.tok.convert_tokens_to_ids(self.audio_token)

    def prefix(self, system: str) -> str:
        """The recipe's build_prefix_messages + apply_chat_template(add_generation_prompt=True)."""
        msgs = [{"role": "system", "content": system or ""}, {"role": "user", "content": [{"type": "audio", "audio": None}]}]
        return self.processor.apply_chat_template([msgs], add_generation_prompt=True, tokenize=False)[0]

    def expand(self, text: str, n_audio: int) -> str:
        return text.replace(self.audio_token, self.audio_token * n_audio, 1)

    @staticmethod
    def system(utt: Utterance) -> str:
        """The system turn: the recipe line's ``prompt`` (Qwen3-ASR's context text), else empty, as Qwen3-ASR's own
        inference and brisk's decoding give it. A FunASR line's system message is FunASR's instruction to its own
        model ("You are a helpful assistant."), not context: trained on, it would be a prompt decoding never shows."""
        return utt.context.get("system", "")

    def build(self, utt: Utterance, n_audio: int) -> Tokens:
        pre = self.expand(self.prefix(self.system(utt)), n_audio)
        full = pre + target_text(utt, self.language) + (self.tok.eos_token or "")
        ids = list(self.tok(full)["input_ids"])
        n_pre = len(self.tok(pre)["input_ids"])  # the recipe's prefix length: the prefix tokenized alone
        labels = [-100] * n_pre + ids[n_pre:]
        start = ids.index(self.audio_id)
        if ids[start:start + n_audio] != [self.audio_id] * n_audio:
            raise DataError(f"{utt.source}: the prompt does not hold {n_audio} audio tokens in a row")
        return Tokens(ids, labels, [(start, n_audio)], utt.audio_paths()[:1])


def rows_after_convs(frames: int) -> int:
    """Rows of ``frames`` mel frames after the audio tower's three (k=3, s=2, p=1) convolutions."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def audio_token_count(frames: int, n_window: int = 50) -> int:
    """Audio-tower output rows for ``frames`` mel frames: whole chunks of 2 * n_window frames and the rest, each
    through the convolutions (transformers' _get_feat_extract_output_lengths, in plain integers on the host)."""
    full, rest = divmod(frames, 2 * n_window)
    return full * rows_after_convs(2 * n_window) + rows_after_convs(rest)


def tower_window(cfg) -> int:
    """The audio tower's n_window (its chunks are 2 * n_window mel frames): model.llm.config's audio_config, else the
    folder's config.json (model.llm.path), else transformers' default of 50. The audio token count of a clip
    depends on it, so the samples count with the model's own value."""
    audio = dict(cfg.model.llm.config.get("audio_config") or {})
    folder = Path(cfg.model.llm.path) / "config.json" if cfg.model.llm.path else None
    if "n_window" not in audio and folder is not None and folder.is_file():
        audio = dict(json.loads(folder.read_text(encoding="utf-8")).get("audio_config") or {})
    return int(audio.get("n_window", 50))


def features(feature_extractor, wave: torch.Tensor) -> torch.Tensor:
    """The processor's log-mel features of one utterance, its valid frames: [F, 128]."""
    out = feature_extractor(wave.numpy(), sampling_rate=feature_extractor.sampling_rate, padding=True,
                            return_attention_mask=True, return_tensors="pt")
    n = int(out["attention_mask"].sum())
    return out["input_features"][0, :, :n].T.contiguous()


class Qwen3ASRDataset(torch.utils.data.Dataset):
    def __init__(self, utterances: list[Utterance], processor, language: str | None, skip_bad: bool,
                 max_speech_length: int, n_window: int = 50):
        self.utts, self.n_window = utterances, n_window
        self.fe = processor.feature_extractor
        self.prompt = Qwen3ASRPrompt(processor, language)
        self.tok = self.prompt.tok  # what train.val_decode encodes references with
        self.skip_bad, self.max_frames = skip_bad, max_speech_length

    def __len__(self) -> int:
        return len(self.utts)

    def lengths(self) -> list[int]:
        return [u.source_len for u in self.utts]

    def __getitem__(self, item: tuple[int, int] | int) -> Sample:
        index, _ = item if isinstance(item, tuple) else (item, 0)
        utt = self.utts[index]
        try:
            notes: list[tuple[str, str]] = []
            path = utt.audio_paths()[0]
            feats = features(self.fe, read_audio(path, self.fe.sampling_rate, notes))
            if feats.shape[0] > self.max_frames:
                raise DataError(f"audio file {path} gives {feats.shape[0]} mel frames, over data.max_speech_length")
            tokens = self.prompt.build(utt, audio_token_count(feats.shape[0], self.n_window))
            return Sample(utt.key, [feats], tokens, notes=notes)
        except (AudioError, DataError) as e:
            message = f"{utt.source}: {e}" if not str(e).startswith(utt.source) else str(e)
            if not self.skip_bad:
                raise DataError(message, "samples") from None
            return Sample(utt.key, error=message)


def qwen3_asr_dataset(cfg, which: str, path: str | None, vocab_size: int, tokenizer=None, prepared=None):
    """Qwen3-ASR's split (the family's ``dataset``)."""
    if not path:
        if which == "train":
            raise ConfigError("data.train: give a Qwen3-ASR fine-tuning jsonl ({\"audio\": ..., \"text\": ...} a line) "
                              "or a FunASR jsonl")
        return None
    utts, skipped = read_lines(path, cfg)
    dataset = Qwen3ASRDataset(utts, load_processor(cfg), section(cfg).language, cfg.data.skip_bad,
                              math.ceil(cfg.data.max_speech_length), tower_window(cfg))
    return dataset, skipped, {"bad_lines": len(skipped)}


def graph_examples(cfg, collator, vocab: int, max_tokens: int) -> list:
    """One batch per packed bucket up to ``max_tokens`` of exactly the bucket's length, in the collator's static
    shapes, for capturing the step graphs before training (the family's ``graph_examples``). Only the token row
    reaches a step graph (the audio tower runs eagerly before it), so each is one short utterance (16 mel frames:
    2 audio rows for any window of 16 frames or more, so that compiled tower layers are not specialised to a
    single row) and random tokens, labelled after a short prompt."""
    audio = cfg.model.llm.config.get("audio_config") or {}
    frames, prefix = 16, 8
    n_audio = audio_token_count(frames, tower_window(cfg))
    g = torch.Generator().manual_seed(0)
    out = []
    for ids in example_rows(cfg.speed.pack_buckets, vocab, max_tokens):
        t = len(ids)
        labels = [-100] * (prefix + n_audio) + ids[prefix + n_audio:]
        tokens = Tokens(ids, labels, [(prefix, n_audio)], ["<synthetic>"])
        feats = torch.randn(frames, audio.get("num_mel_bins", 128), generator=g)
        out.append(collator([Sample(f"graph_example_{t}", [feats], tokens)]))
    return out


def eval_set(path: str, cfg) -> tuple[list[str], list[str], list[str]]:
    """(keys, audio paths, transcripts) of either jsonl, for `brisk eval` (the family's ``eval_set``)."""
    utts, _ = read_lines(path, cfg)
    return [u.key for u in utts], [u.audio_paths()[0] for u in utts], [u.assistant[0] for u in utts]
