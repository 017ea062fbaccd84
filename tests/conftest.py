"""Shared fixtures: tiny configs and the bundled demo data (no network, CPU only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "data" / "demo"
DEMO_CONFIG = REPO / "configs" / "demo.yaml"

# Two CPU cores on CI: keep torch from oversubscribing them.
torch.set_num_threads(min(2, os.cpu_count() or 1))

TINY_QWEN3 = dict(model_type="qwen3", vocab_size=483, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                  tie_word_embeddings=True)


def nano_config(llm_path, enc: dict, ad: dict):
    """A Fun-ASR-Nano Config of the given encoder and adaptor sizes (both frozen), features without dither, the
    LLM from ``llm_path`` in fp32."""
    from brisk.config import AudioAdaptorConfig, AudioEncoderConfig, Config, LLMConfig, ModelConfig
    from brisk.families.fun_asr_nano.config import AdaptorConfig, EncoderConfig, FrontendConfig, FunAsrNanoConfig

    cfg = Config(model=ModelConfig(encoder=AudioEncoderConfig(freeze=True), adaptor=AudioAdaptorConfig(freeze=True),
                                   llm=LLMConfig(path=str(llm_path), dtype="fp32")))
    cfg.sections["fun_asr_nano"] = FunAsrNanoConfig(frontend=FrontendConfig(dither=0.0), encoder=EncoderConfig(**enc),
                                                    adaptor=AdaptorConfig(**ad))
    return cfg


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO / "tokenizer"), local_files_only=True)


@pytest.fixture(scope="session")
def qwen3_folder(tmp_path_factory) -> Path:
    """A local Qwen3 'model folder' with only config.json (random weights are built from it)."""
    from transformers import AutoConfig

    folder = tmp_path_factory.mktemp("qwen3_tiny")
    extra = dict(TINY_QWEN3)
    AutoConfig.for_model(extra.pop("model_type"), **extra).save_pretrained(folder)
    return folder


def tiny_overrides(run_dir: Path, **extra) -> list[str]:
    """key=value overrides that shrink the demo config further for fast tests."""
    items = {
        "fun_asr_nano.encoder.output_size": 32, "fun_asr_nano.encoder.linear_units": 64, "fun_asr_nano.encoder.num_blocks": 2,
        "fun_asr_nano.encoder.tp_blocks": 1, "fun_asr_nano.adaptor.ffn_dim": 64, "fun_asr_nano.adaptor.n_layer": 1,
        "model.llm.config.hidden_size": 32, "model.llm.config.intermediate_size": 64,
        "model.llm.config.num_attention_heads": 2, "model.llm.config.num_key_value_heads": 1,
        "model.llm.config.head_dim": 16, "train.output_dir": str(run_dir), "train.progress": False,
        "train.tensorboard": False, "train.log_every": 2, "data.num_workers": 0, "diagnose.report": False,
        "train.export": "none",
        # the 240 base utterances (26 batches an epoch), not the demo's 1,200: tests count on that epoch
        "data.train": str(DEMO / "train.jsonl"),
    }
    items.update(extra)
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in items.items()]


def tiny_config(run_dir: Path, **extra):
    from brisk.config import load_config

    return load_config(DEMO_CONFIG, tiny_overrides(run_dir, **extra))


def run_train(run_dir: Path, **extra) -> dict:
    """A short real training run of the tiny demo model on the bundled data."""
    from brisk.train.run import train

    return train(tiny_config(run_dir, **extra))


def speed_parts(model, cfg, device: str = "cpu"):
    """What assembling a run does to a model for its speed switches: the plan for ``device``, then
    brisk.speed.accelerate. Returns (the effective config, the plan, the Accelerated parts)."""
    from brisk.plan import make_plan
    from brisk.speed import accelerate

    cfg, plan = make_plan(cfg, device)
    return cfg, plan, accelerate(model, plan)
