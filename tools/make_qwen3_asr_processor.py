"""A tiny Qwen3-ASR processor folder for brisk's tests and CPU demo: the demo tokenizer (data/demo/tokenizer)
plus Qwen3-ASR's special tokens (<|audio_start|>, <|audio_pad|>, <|audio_end|>, <asr_text>), a chat template
that renders Qwen3-ASR's prompt, and transformers' Qwen3ASRFeatureExtractor with its defaults (128 mel bins).

    python tools/make_qwen3_asr_processor.py --out data/demo/qwen3_asr_processor [--pad-is-eos]

The prompt the template renders, as Qwen3-ASR's own does:
    <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n<|audio_start|><|audio_pad|><|audio_end|><|im_end|>\\n
    <|im_start|>assistant\\n
The real model's tokenizer is Qwen3's (151,643 BPE tokens); this one has the demo set's 392 and the eos
<|im_end|>. Its pad token is <|endoftext|>, or with --pad-is-eos <|im_end|> (the eos), to show what the
official recipe's pad masking does then.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'audio' or 'audio' in part %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = {"audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>", "audio_token": "<|audio_pad|>"}


def make(out: Path, pad_is_eos: bool = False) -> Path:
    from transformers import AutoTokenizer, Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

    # extra_special_tokens: the named tokens (tok.audio_token, ...) Qwen3ASRProcessor reads
    tok = AutoTokenizer.from_pretrained(ROOT / "data" / "demo" / "tokenizer", local_files_only=True,
                                        extra_special_tokens=dict(SPECIAL))
    tok.add_special_tokens({"additional_special_tokens": ["<asr_text>"]})
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|im_end|>" if pad_is_eos else "<|endoftext|>"
    processor = Qwen3ASRProcessor(Qwen3ASRFeatureExtractor(), tok, chat_template=TEMPLATE)
    processor.save_pretrained(out)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "data" / "demo" / "qwen3_asr_processor"))
    p.add_argument("--pad-is-eos", action="store_true")
    a = p.parse_args()
    print(make(Path(a.out), a.pad_is_eos))
