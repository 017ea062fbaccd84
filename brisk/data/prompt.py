"""The chat prompt and label masking, token for token as FunASR's training dataset builds them.

Turn 0:  <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{user}<|im_end|>\\n<|im_start|>assistant\\n
Turn k:  <|im_start|>user\\n{user}<|im_end|>\\n<|im_start|>assistant\\n
then (with do_think=false) <think>\\n\\n</think>\\n\\n, then the answer {assistant}<|im_end|>.
The text around each <|startofspeech|>...<|endofspeech|> reference is tokenized piece by piece, and the
reference becomes audio_token_count(L) placeholder tokens (id 0) that the model overwrites with adaptor
outputs. Labels are -100 everywhere but on the answer tokens. {header} is FunASR's context header
(data.prompt_class, see context.py), empty without one; with sys_prompt=false turn 0 drops the system part.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from ..formats.funasr import audio_token_count
from .context import ContextPrompt
from .jsonl import DataError, Utterance

_SPLIT = re.compile(r"(<\|startofspeech\|>.*?<\|endofspeech\|>)")


@dataclass
class Tokens:
    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    audio_slots: list[tuple[int, int]] = field(default_factory=list)  # (first position, count) per audio
    audio_paths: list[str] = field(default_factory=list)


class PromptBuilder:
    def __init__(self, tokenizer, *, sys_prompt: bool = True, do_think: bool = True, multiturn_max: int = 5,
                 max_token_length: int = 1500, use_low_frame_rate: bool = True, context: ContextPrompt | None = None):
        self.tok = tokenizer
        self.sys_prompt, self.do_think = sys_prompt, do_think
        self.multiturn_max, self.max_token_length = multiturn_max, max_token_length
        self.low_frame_rate = use_low_frame_rate
        self.context = context

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text))

    def build(self, utt: Utterance, audio_frames: list[int], rng: random.Random | None = None) -> Tokens:
        """``audio_frames``: LFR frames of each audio reference, in order; ``rng`` orders hotwords (if any)."""
        out = Tokens()
        frames = iter(audio_frames)
        for i, (system, user, answer, prev) in enumerate(zip(utt.system, utt.user, utt.assistant, utt.prev_content)):
            if i >= self.multiturn_max or len(out.input_ids) > self.max_token_length:
                break
            if i == 0:
                header = self.context.header(utt.context, user, rng or random.Random(0)) if self.context else ""
                source = f"<|im_start|>user\n{header}{user}<|im_end|>\n<|im_start|>assistant\n"
                if self.sys_prompt:
                    source = f"<|im_start|>system\n{system}<|im_end|>\n" + source
            else:
                source = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
            if not self.do_think:
                source += "<think>\n\n</think>\n\n"
            ids: list[int] = []
            for piece in _SPLIT.split(source):
                if not piece.startswith("<|startofspeech|>"):
                    ids += self.encode(piece)
                    continue
                ref = piece[len("<|startofspeech|>"):-len("<|endofspeech|>")]
                if not ref.startswith("!"):
                    raise DataError(f"{utt.source}: audio reference {ref!r} must start with '!' followed by a path")
                n = audio_token_count(next(frames), self.low_frame_rate)
                out.audio_slots.append((len(out.input_ids) + len(ids), n))
                out.audio_paths.append(ref[1:])
                ids += [0] * n
            if prev is not None:  # FunASR: a given answer prefix joins the prompt, unlabelled
                ids += self.encode(prev)
            target = self.encode(f"{answer}<|im_end|>")
            out.input_ids += ids + target
            out.labels += [-100] * len(ids) + target
        if len(out.input_ids) > self.max_token_length:
            raise DataError(f"{utt.source}: {len(out.input_ids)} LLM tokens, over data.max_token_length={self.max_token_length}")
        return out
