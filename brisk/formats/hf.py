"""A transformers-native Fun-ASR-Nano folder (config.json with model_type fun_asr_nano) read into brisk's keys."""

from __future__ import annotations

import json
from pathlib import Path

from .funasr import FAMILY


def hf_folder_model_config(folder) -> dict:
    """A native Fun-ASR-Nano folder's config.json -> brisk's keys: {"model": the inline LLM config,
    "fun_asr_nano": the sizes and front end}."""
    raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    pre = Path(folder) / "preprocessor_config.json"
    fx = json.loads(pre.read_text(encoding="utf-8")) if pre.is_file() else {}
    a, ad, text = raw.get("audio_config") or {}, raw.get("adaptor_config") or {}, dict(raw.get("text_config") or {})
    tp = a.get("num_timestamp_prediction_layers", 20)
    for k in ("architectures", "dtype", "torch_dtype", "transformers_version", "_name_or_path"):
        text.pop(k, None)
    own = {
        "encoder": {"output_size": a.get("hidden_size", 512), "attention_heads": a.get("num_attention_heads", 4),
                    "linear_units": a.get("intermediate_size", 2048), "num_blocks": a.get("num_hidden_layers", 70) - tp,
                    "tp_blocks": tp, "kernel_size": a.get("fsmn_kernel_size", 11), "sanm_shift": 0},
        "adaptor": {"downsample_rate": 1, "ffn_dim": ad.get("projector_hidden_size", 2048),
                    "n_layer": ad.get("num_hidden_layers", 2), "attention_heads": ad.get("num_attention_heads", 8),
                    "use_low_frame_rate": ad.get("use_low_frame_rate", True)},
        "ctc": {"enabled": False},
        "frontend": {"n_mels": a.get("num_mel_bins", 80), "lfr_m": a.get("num_stacked_frames", 7),
                     **{ours: fx[theirs] for theirs, ours in (("sampling_rate", "fs"), ("stride_lfr", "lfr_n"),
                        ("frame_length", "frame_length"), ("frame_shift", "frame_shift"), ("window", "window"))
                        if theirs in fx}},
    }
    return {"model": {"llm": {"config": text}}, FAMILY: own}


def is_hf_folder(folder) -> bool:
    p = Path(folder) / "config.json"
    if not p.is_file():
        return False
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("model_type") == "fun_asr_nano"
    except ValueError:
        return False

