"""Fun-ASR-Nano: a SANM audio encoder, a Transformer adaptor and a Qwen3 decoder, on FunASR jsonl; its folders
are FunASR's and transformers' ``fun_asr_nano``.

This package holds all of it: model.py (SpeechLLM), sanm.py and adaptor.py (the audio encoder and adaptor),
build.py, config.py (its own keys), data.py (FunASR jsonl), decode.py, export.py (the FunASR and transformers folders) and hf_native.py
(transformers' own fun_asr_nano classes). This module is its spec: the plan reads it before torch is imported,
so each part below imports its module when first called."""

from __future__ import annotations

from ...errors import ConfigError
from ..registry import Family, FamilyRule, register, section, trained_audio_rule
from .config import FunAsrNanoConfig

# The switches that act on the frozen audio path or on the graphed step around it.
FROZEN_AUDIO = ("frozen_eval", "encoder_dtype", "encoder_cache", "cuda_graph", "fresh_grads")


def encoder_blocks(model, compile: bool = False) -> list:
    """The SANM blocks (of the model, or of the frozen path's copy). Compiling leaves out the first block
    (encoders0): it takes the 560-wide LFR features, a graph of its own for one block of 70."""
    enc = model.audio_encoder
    return [enc.encoders, enc.tp_encoders] if compile else [enc.encoders0, enc.encoders, enc.tp_encoders]


def build(cfg, device=None):
    from .build import build_speech_model

    return build_speech_model(cfg.model, section(cfg), device)


def dataset(cfg, which, path, vocab_size, tokenizer=None, prepared=None):
    from .data import speech_dataset

    return speech_dataset(cfg, which, path, vocab_size, tokenizer, prepared)


def prepare(cfg, which, path, tokenizer=None):
    from .data import speech_prepare

    return speech_prepare(cfg, which, path, tokenizer)


def write_funasr(model, cfg, state, out, dtype, tokenizer):
    from .export import write_funasr

    write_funasr(model, cfg, state, out, dtype, tokenizer)


def write_hf(model, cfg, state, out, dtype, tokenizer):
    from .export import write_hf

    check_native(section(cfg))  # `brisk export --format hf` of a run that was not trained with train.export=hf

    write_hf(model, cfg, state, out, dtype, tokenizer)


def readme(out, fmt, dtype, cfg):
    from .export import write_readme

    write_readme(out, fmt, dtype, cfg)


def recognizer(cfg, model, tokenizer, device="cpu", **kw):
    from .decode import funasr_recognizer

    return funasr_recognizer(cfg, model, tokenizer, device, **kw)


def val_recognizer(model, dataset, device, fast=False):
    from .decode import funasr_val_recognizer

    return funasr_val_recognizer(model, dataset, device, fast)


def folder_overrides(folder):
    from .hf_native import folder_overrides

    return folder_overrides(folder)


def graph_examples(cfg, collator, vocab, max_tokens):
    from .data import graph_examples

    return graph_examples(cfg, collator, vocab, max_tokens)


# What transformers' FunAsrNano class cannot express: (key, broken(this family's section), why). Refused when the
# config is loaded with train.export=hf, and by the hf exporter itself (a later `brisk export --format hf`).
NATIVE_LIMITS = (
    ("fun_asr_nano.adaptor.downsample_rate", lambda own: own.adaptor.downsample_rate != 1,
     "the native class has no frame stacking (needs 1)"),
    ("fun_asr_nano.encoder.sanm_shift", lambda own: own.encoder.sanm_shift != 0,
     "the native FSMN is centred (needs 0)"),
    ("fun_asr_nano.encoder.tp_blocks", lambda own: own.encoder.tp_blocks < 1,
     "the native encoder expects at least one timestamp block"),
)


def check_native(own: FunAsrNanoConfig) -> None:
    """One line naming the first key the native class cannot express, with its value."""
    for key, broken, why in NATIVE_LIMITS:
        if broken(own):
            part, name = key.split(".")[1:]
            raise ConfigError(f"{key}={getattr(getattr(own, part), name)}: {why}")


FAMILY = register(Family(
    name="fun_asr_nano",
    summary="a speech-LLM of Fun-ASR-Nano's architecture on FunASR jsonl",
    switches=frozenset({"frozen_eval", "encoder_dtype", "encoder_cache", "fuse_projections", "compile", "packing",
                        "label_head", "sdpa_backends", "cuda_graph", "fresh_grads", "fused_adamw", "tf32", "liger",
                        "optimizer_in_backward",
                        "flex_attention"}),
    # Each value joined the preset when the probe against the eager step met its gates and an interleaved bench on
    # the GPU showed it paid (docs/finetune-speed.md has the measurements).
    presets={"fast": {"packing": True, "cuda_graph": True, "frozen_eval": True, "encoder_dtype": "bf16",
                      "compile": True, "fused_adamw": True, "label_head": True, "label_rows_frac": 0.3,
                      "fresh_grads": True, "fuse_projections": True,
                      # 1,792 and 2,304 too: FunASR's ~1,600-token steps pad to 1,741 positions, not 1,971
                      "pack_buckets": [256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2304, 2560,
                                       3072, 4096],
                      # static decoder layers with FlexAttention traced into them, each bucket's graph captured when
                      # the data first reaches it (buckets the data never reaches cost nothing)
                      "compile_dynamic": False, "flex_attention": True, "graph_capture": "seen"}},
    frozen_audio=FROZEN_AUDIO,
    rules=tuple(FamilyRule(f"train.export, {key}", lambda c, b=broken: c.train.export == "hf" and b(section(c)),
                           f"train.export=hf: {key}: {why}; or export funasr") for key, broken, why in NATIVE_LIMITS),
    build=build,
    dataset=dataset,
    prepare=prepare,
    exporters={"funasr": write_funasr, "hf": write_hf},
    readme=readme,
    recognizer=recognizer,
    val_recognizer=val_recognizer,
    folder_types=("fun_asr_nano",),  # its transformers-native folder (train.export=hf)
    folder_overrides=folder_overrides,
    encoder_blocks=encoder_blocks,
    audio_path=("audio_encoder", "audio_adaptor"),
    outside_loss=lambda model: [m for m in (model.ctc_decoder, model.ctc) if m is not None],
    audio_graphs=True,  # the SANM encoder and adaptor read nothing on the host: one graph per speech bucket
    # with the encoder or adaptor training the step graph holds them too, on the speech padded to its buckets
    trained_audio_graph=trained_audio_rule,
    graph_examples=graph_examples,
    config=FunAsrNanoConfig,
))
