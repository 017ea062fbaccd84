#!/usr/bin/env python3
"""A random Fun-ASR-Nano model folder in FunASR's layout, at real sizes (or --tiny), for benchmarks.

    <out>/config.yaml      as FunASR writes it (the keys brisk's funasr_folder_config reads, FunASR's names)
    <out>/model.pt         {"state_dict": ...} in FunASR's key layout, bf16 weights (FunASR stores bf16)
    <out>/Qwen3-0.6B/      config.json (Qwen3-0.6B sizes) and a tokenizer

The weights are brisk's modules (same key layout and sizes as FunASR's classes; FunASR itself is not
needed, so this runs on a GPU machine without it), seeded, built on the GPU when there is one (a 0.8B
model initialises there in seconds). No CTC decoder. No real Qwen tokenizer is available offline: the
folder gets brisk's demo tokenizer (vocabulary 483, same special tokens), which the random 151,936-row
embedding covers; prompts are therefore shorter than with Qwen's tokenizer.

    python tools/make_nano_folder.py --out bench/tmp/nano_folder
    python tools/make_nano_folder.py --out bench/tmp/nano_tiny --tiny
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TINY = {"fun_asr_nano.encoder.output_size": 32, "fun_asr_nano.encoder.linear_units": 64, "fun_asr_nano.encoder.num_blocks": 2,
        "fun_asr_nano.encoder.tp_blocks": 1, "fun_asr_nano.adaptor.ffn_dim": 64, "fun_asr_nano.adaptor.n_layer": 1,
        "model.llm.config.vocab_size": 512, "model.llm.config.hidden_size": 32,
        "model.llm.config.intermediate_size": 64, "model.llm.config.num_hidden_layers": 2,
        "model.llm.config.num_attention_heads": 2, "model.llm.config.num_key_value_heads": 1,
        "model.llm.config.head_dim": 16, "model.llm.config.bos_token_id": 0, "model.llm.config.eos_token_id": 0}


# The real Fun-ASR-Nano-2512 config.yaml's dataset_conf, values as published, but data_split_num (finetune.sh sets
# it). tests/test_prompt_parity.py builds its folders from it too.
PUBLISHED_DATASET_CONF = {
    "index_ds": "FunASR", "batch_sampler": "BatchSampler", "batch_type": "token", "batch_size": 6000,
    "max_token_length": 3500, "shuffle": True, "sort_size": 1024, "batch_size_scale_ratio_max": 2, "num_workers": 4,
    "audio_adaptor_downsample_rate": 1, "audio_encoder_downsample_rate": 6,
    "batch_size_sample_max": 10, "retry": 2000, "batch_size_token_max": 6000, "max_source_length": 12000,
    "max_target_length": 2048, "min_source_length": 10, "batch_size_scale_threshold": 3000,
    "prompt_classes": "MultiContextPrompt",
    "prompt_conf": {"max_neg_hotwords_num": 0, "min_neg_hotwords_num": 0, "use_hist": False,
                    "use_one_pass_result": True, "use_hotwords": True, "use_asr_hotwords": True,
                    "chinese_hotwords_list": None, "english_hotwords_list": None},
    "use_dynamic_output_ratio": 0.0,
}


def funasr_config(cfg, own, llm_dir: str) -> dict:
    """config.yaml with FunASR 1.4's names (sanm_shfit is FunASR's spelling), from the model section and the
    family's own (sizes, front end)."""
    e, a, fe = own.encoder, own.adaptor, own.frontend
    return {
        "model": "FunASRNano",
        "model_conf": {"lsm_weight": 0.0, "length_normalized_loss": True},
        "frontend": "WavFrontend",
        "frontend_conf": {"fs": fe.fs, "window": fe.window, "n_mels": fe.n_mels, "frame_length": fe.frame_length,
                          "frame_shift": fe.frame_shift, "lfr_m": fe.lfr_m, "lfr_n": fe.lfr_n},
        "audio_encoder": "SenseVoiceEncoderSmall",
        "audio_encoder_conf": {"output_size": e.output_size, "attention_heads": e.attention_heads,
                               "linear_units": e.linear_units, "num_blocks": e.num_blocks, "tp_blocks": e.tp_blocks,
                               "dropout_rate": e.dropout_rate, "attention_dropout_rate": e.attention_dropout_rate,
                               "kernel_size": e.kernel_size, "sanm_shfit": e.sanm_shift, "freeze": cfg.encoder.freeze},
        "audio_adaptor": "Transformer",
        "audio_adaptor_conf": {"downsample_rate": a.downsample_rate, "ffn_dim": a.ffn_dim,
                               "llm_dim": cfg.llm.config["hidden_size"], "encoder_dim": e.output_size,
                               "n_layer": a.n_layer, "attention_heads": a.attention_heads, "freeze": cfg.adaptor.freeze},
        "llm": "Qwen3-0.6b",
        "llm_conf": {"hub": "hf", "freeze": cfg.llm.freeze, "llm_dtype": "bf16", "init_param_path": llm_dir,
                     "use_lora": False},
        # The published Fun-ASR-Nano-2512 dataset and tokenizer settings (FunASR's own trainer, train_ds.py, runs
        # on this folder as on the real one); its recipe trains with the MultiContextPrompt header, so the
        # benchmark's LLM rows carry it too. data_split_num is finetune.sh's to set.
        "dataset": "FunASR",
        "tokenizer": "HuggingfaceTokenizer",
        "tokenizer_conf": {"init_param_path": llm_dir},
        "dataset_conf": PUBLISHED_DATASET_CONF,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/nano_folder")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (CPU tests of the benchmark)")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    import torch
    import yaml
    from transformers import AutoConfig

    from brisk.config import load_config
    from brisk.families import section
    from brisk.models.build import build_model

    t0 = time.perf_counter()
    overrides = [f"{k}={json.dumps(v)}" for k, v in (TINY if a.tiny else {}).items()]
    full = load_config(REPO / "configs" / "fun_asr_nano.yaml", overrides)
    cfg, own = full.model, section(full)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    out = Path(a.out)
    if out.exists():
        shutil.rmtree(out)
    llm_dir = out / "Qwen3-0.6B"
    llm_dir.mkdir(parents=True)
    extra = dict(cfg.llm.config)
    AutoConfig.for_model(extra.pop("model_type"), **extra).save_pretrained(llm_dir)
    for f in (REPO / "data" / "demo" / "tokenizer").iterdir():
        shutil.copy(f, llm_dir / f.name)
    model = build_model(full, device)
    state = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
    torch.save({"state_dict": state}, out / "model.pt")
    (out / "config.yaml").write_text(yaml.safe_dump(funasr_config(cfg, own, "Qwen3-0.6B"), sort_keys=False))
    n = sum(v.numel() for k, v in state.items() if not k.endswith("lm_head.weight"))
    print(json.dumps({"folder": str(out), "parameters": n, "model_pt_bytes": (out / "model.pt").stat().st_size,
                      "device": device, "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
