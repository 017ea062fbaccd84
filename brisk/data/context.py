"""FunASR's context header (dataset_conf.prompt_classes: MultiContextPrompt), as FunASR 1.4.16 writes it.

With a prompt class set, FunASR's training dataset puts a header before the first user turn's text:
an English or a Chinese sentence chosen by the language of the user text before <|startofspeech|>,
then either the context lines the utterance carries (history, one-pass result, hotwords; each enabled by
prompt_conf) or three blank lines. Inference (FunASRNano.inference) never adds it.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from ..config import ConfigError

TEMPLATES = {
    "en": {
        "header": "Please combine the context information provided below to complete the speech transcription task "
                  "more accurately. If there is no relevant information, we will leave it blank.\n",
        "hist_context": "Historical transcription: {}\n",
        "one_pass_result": "One-pass result: {}\n",
        "hotwords": "Hotword list: {}\n",
    },
    "zh": {
        "header": "请结合下面提供的上下文信息，更加准确地完成语音转写任务。如果没有相关信息，我们会留空。\n",
        "hist_context": "历史转写结果：{}\n",
        "one_pass_result": "一遍解码结果：{}\n",
        "hotwords": "热词列表：{}\n",
    },
}

# MultiContextPrompt's keyword arguments and FunASR's defaults for them.
DEFAULTS = dict(use_hist=True, use_one_pass_result=True, use_hotwords=True, use_asr_hotwords=True,
                use_multi_lingual_prompt=True, chinese_hotwords_list=None, english_hotwords_list=None,
                max_neg_hotwords_num=900, min_neg_hotwords_num=0)
CLASSES = ("MultiContextPrompt",)
_ZH = re.compile("[\u4e00-\u9fff]+")
_EN = re.compile(r"[A-Za-z]+")


def detect_language(text: str | list[str]) -> str:
    """'zh' when CJK ideographs outnumber Latin letters and make up over 30% of the characters, else 'en'."""
    if isinstance(text, list):
        text = " ".join(text)
    if not text:
        return "zh"
    zh = sum(len(m) for m in _ZH.findall(text))
    en = sum(len(m) for m in _EN.findall(text))
    return "zh" if zh > en and zh / len(text) > 0.3 else "en"


class ContextPrompt:
    """``header(context, first_user_turn, rng)`` -> the text FunASR puts before the user's prompt."""

    def __init__(self, prompt_class: str, prompt_conf: dict):
        if prompt_class not in CLASSES:
            raise ConfigError(f"data.prompt_class={prompt_class!r}: brisk reproduces {', '.join(CLASSES)} (or leave it null)")
        unknown = sorted(set(prompt_conf) - set(DEFAULTS))
        if unknown:
            raise ConfigError(f"data.prompt_conf.{unknown[0]}: unknown key; valid keys: {', '.join(DEFAULTS)}")
        conf = {**DEFAULTS, **prompt_conf}
        self.conf = conf
        self.neg = {"zh": _read_list(conf["chinese_hotwords_list"], "chinese_hotwords_list"),
                    "en": _read_list(conf["english_hotwords_list"], "english_hotwords_list")}

    def header(self, context: dict, user: str, rng: random.Random) -> str:
        lang = detect_language(user.split("<|startofspeech|>")[0])
        t, c = TEMPLATES[lang], self.conf
        lines = []
        if c["use_hist"] and context.get("hist_context"):
            lines.append(t["hist_context"].format(context["hist_context"]))
        if c["use_one_pass_result"] and context.get("one_pass_result"):
            lines.append(t["one_pass_result"].format(context["one_pass_result"]))
        hotwords = None
        if c["use_hotwords"] and context.get("hotwords"):
            hotwords = context["hotwords"]
        if c["use_asr_hotwords"] and context.get("asr_hotwords"):
            hotwords = context["asr_hotwords"]
        if hotwords:
            words = list(hotwords) if isinstance(hotwords, list) else hotwords.split(", ")
            words += self._negatives(self.neg[detect_language(hotwords)], rng)
            rng.shuffle(words)  # FunASR shuffles with the process-wide RNG; here it is seeded per sample
            lines.append(t["hotwords"].format(", ".join(words)))
        return t["header"] + ("".join(lines) if lines else "\n\n\n")

    def _negatives(self, pool: list[str] | None, rng: random.Random) -> list[str]:
        """A random number (min..max_neg_hotwords_num) of distractor hotwords from the list file."""
        if not pool:
            return []
        hi = min(self.conf["max_neg_hotwords_num"], len(pool)) if self.conf["max_neg_hotwords_num"] > -1 else len(pool)
        lo = self.conf["min_neg_hotwords_num"]
        n = rng.randint(lo, hi) if lo < hi else hi
        return rng.sample(pool, n) if n > 0 else []


def _read_list(path: str | None, key: str) -> list[str] | None:
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"data.prompt_conf.{key}: {path} does not exist")
    return p.read_text(encoding="utf-8").strip().split("\n")
