"""Qwen3-ASR: transformers' ``qwen3_asr`` (an audio tower of windowed Transformer layers over 128-bin log-mel
features, a two-layer projector, a Qwen3 decoder), fine-tuned as QwenLM/Qwen3-ASR's finetuning/qwen3_asr_sft.py
does, on its jsonl ({"audio", "text"}) or on FunASR jsonl. Its folder is transformers'
Qwen3ASRForConditionalGeneration folder (weights, config, processor).

This package holds all of it: model.py (Qwen3ASR, its builder and export), data.py (its jsonl and FunASR jsonl,
the log-mel features) and decode.py. This module is its spec: the plan reads it before torch is imported, so each
part below imports its module when first called."""

from __future__ import annotations

from dataclasses import dataclass

from ...keys import key
from ..registry import Family, FamilyRule, register, trained_audio_rule


@dataclass
class Qwen3ASRConfig:
    """Qwen3-ASR's own keys (the ``qwen3_asr:`` section)."""

    language: str | None = key(None, "FunASR jsonl targets become 'language <this><asr_text>...' and decoding is "
                               "prefilled with it (none: 'language None', no prefill)")


def encoder_blocks(model, compile: bool = False) -> list:
    """The audio tower's Transformer layers (of the model, or of the frozen path's copy)."""
    return [model.audio_tower.layers]


def _transformers_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "none"


def _has_qwen3_asr() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers.models.qwen3_asr") is not None


def graph_examples(cfg, collator, vocab, max_tokens):
    from .data import graph_examples

    return graph_examples(cfg, collator, vocab, max_tokens)


def build(cfg, device=None):
    from .model import build_qwen3_asr

    return build_qwen3_asr(cfg.model, device)


def dataset(cfg, which, path, vocab_size, tokenizer=None, prepared=None):
    from .data import qwen3_asr_dataset

    return qwen3_asr_dataset(cfg, which, path, vocab_size, tokenizer, prepared)


def write_hf(model, cfg, state, out, dtype, tokenizer):
    from .model import write_qwen3_asr_hf

    write_qwen3_asr_hf(model, cfg, state, out, dtype, tokenizer)


def readme(out, fmt, dtype, cfg):
    from .model import write_readme

    write_readme(out, fmt, dtype, cfg)


def recognizer(cfg, model, tokenizer, device="cpu", **kw):
    from .decode import qwen3_asr_recognizer

    return qwen3_asr_recognizer(cfg, model, tokenizer, device, **kw)


def val_recognizer(model, dataset, device, fast=False):
    from .decode import qwen3_asr_val_recognizer

    return qwen3_asr_val_recognizer(model, dataset, device, fast)


def eval_set(path, cfg):
    from .data import eval_set

    return eval_set(path, cfg)


def folder_overrides(folder):
    from .model import folder_overrides

    return folder_overrides(folder)


FAMILY = register(Family(
    name="qwen3_asr",
    summary="Qwen3-ASR (transformers' qwen3_asr) on its fine-tuning jsonl or FunASR jsonl",
    switches=frozenset({"frozen_eval", "encoder_dtype", "encoder_cache", "fuse_projections", "compile", "packing",
                        "label_head", "sdpa_backends", "fused_adamw", "tf32", "audio_varlen", "cuda_graph",
                        "fresh_grads", "optimizer_in_backward"}),
    presets={"fast": {"packing": True, "frozen_eval": True, "encoder_dtype": "bf16", "compile": True,
                      "fused_adamw": True, "label_head": True, "fuse_projections": True, "audio_varlen": True,
                      "cuda_graph": True, "fresh_grads": True,
                      # Fun-ASR-Nano's preset buckets: a graph each, captured up front; the bench's ~1,700-2,000-token
                      # steps pad to 1,792 or 2,048 positions
                      "pack_buckets": [256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2304, 2560,
                                       3072, 4096]}},
    # cuda_graph and fresh_grads stay with the tower training: the step graph then holds the tower and projector
    # too (trained_audio_graph), as the official recipe's work trains every weight
    frozen_audio=("frozen_eval", "encoder_dtype", "encoder_cache"),
    # speed.cuda_graph: the audio tower's windows and real rows are worked out on the host from each batch's
    # audio token counts (model.audio_windows), so its work depends on more than the features'
    # shape; the features stay unpadded. Under speed.audio_varlen the tower pads its chunks, rows and windows to
    # a fixed number per step bucket itself (Qwen3ASR.static_audio_inputs) and runs in a graph per bucket;
    # without it transformers' audio attention reads the windows back to the host in each layer, which no graph
    # holds, so the frozen tower runs eagerly before each replay (no host sync) and its rows are copied in.
    audio_graphs=False,
    audio_static_inputs=lambda speed: speed.audio_varlen,
    trained_audio_graph=lambda speed, model: trained_audio_rule(speed, model, "speed.audio_varlen=true (the tower's "
                                                                 "inputs then have fixed shapes a bucket)"
                                                                 if not speed.audio_varlen else None),
    graph_examples=graph_examples,
    rules=(
        FamilyRule("model.family", lambda c: not _has_qwen3_asr(),
                   "model.family=qwen3_asr needs a transformers with Qwen3-ASR (transformers.models.qwen3_asr); "
                   "installed: transformers " + _transformers_version() + "; pip install -U transformers"),
        FamilyRule("model.family, model.path", lambda c: c.model.path,
                   "model.path is a FunASR model folder; with model.family=qwen3_asr give the transformers Qwen3-ASR "
                   "folder as model.llm.path (or model.llm.config for a random one)"),
        FamilyRule("model.family, data.profile", lambda c: c.data.profile,
                   "data.profile makes synthetic Fun-ASR-Nano batches; with model.family=qwen3_asr give data.train"),
        FamilyRule("model.family, data.tokenizer", lambda c: not (c.data.tokenizer or c.model.llm.path),
                   "model.family=qwen3_asr: give data.tokenizer (a Qwen3-ASR processor folder: tokenizer, "
                   "preprocessor_config.json, chat template) or model.llm.path that holds one"),
    ),
    build=build,
    dataset=dataset,
    exporters={"hf": write_hf},
    readme=readme,
    recognizer=recognizer,
    val_recognizer=val_recognizer,
    eval_set=eval_set,
    folder_types=("qwen3_asr",),  # transformers' Qwen3ASRForConditionalGeneration folder (its export)
    folder_overrides=folder_overrides,
    encoder_blocks=encoder_blocks,
    audio_path=("audio_tower", "multi_modal_projector"),
    config=Qwen3ASRConfig,
))
