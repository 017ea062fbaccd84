"""Fun-ASR-Nano's decoding: brisk.eval.decode's Recognizer with FunASR's front end and prompt."""

from __future__ import annotations

import dataclasses

from ...eval.decode import Recognizer
from ..registry import section
from .config import FrontendConfig
from .features import Frontend


def decoding_frontend(fe: FrontendConfig) -> Frontend:
    """The run's front end without dither: decoding never dithers (FunASR's runtime decodes with dither 0)."""
    return Frontend(dataclasses.replace(fe, dither=0.0))


def funasr_recognizer(cfg, model, tokenizer, device: str = "cpu", **kw) -> Recognizer:
    """Fun-ASR-Nano's decoding for `brisk eval` and `brisk transcribe` (the family's ``recognizer``)."""
    return Recognizer(model, tokenizer, decoding_frontend(section(cfg).frontend), device=device,
                      sys_prompt=cfg.data.sys_prompt, do_think=cfg.data.do_think, **kw)


def funasr_val_recognizer(model, dataset, device, fast: bool = False) -> Recognizer:
    """Fun-ASR-Nano's decoding for train.val_decode, with the validation set's tokenizer, front end and prompt
    settings (the family's ``val_recognizer``)."""
    b = dataset.builder
    return Recognizer(model, b.tok, decoding_frontend(dataset.frontend.cfg), device=device,
                      sys_prompt=b.sys_prompt, do_think=b.do_think, fast=fast)
