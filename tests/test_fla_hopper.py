"""The rule of brisk's launcher for fla's gated backward (no GPU needed): which Triton versions on which GPUs
fla refuses, which key head sizes brisk covers there, and the one line for the rest; the head size is read
from the config before the model is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisk.config import load_config
from brisk.config.llm import linear_key_head_dims
from brisk.errors import ConfigError
from brisk.speed import fla_hopper as H

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cap,triton,refused", [
    ((9, 0), (3, 6, 0), True), ((9, 0), (3, 4, 0), True), ((9, 0), (3, 7, 0), True),
    ((9, 0), (3, 7, 1), False), ((9, 0), (3, 3, 1), False), ((8, 0), (3, 6, 0), False), ((10, 0), (3, 6, 0), False),
    (None, (3, 6, 0), False), ((9, 0), None, False)])
def test_the_window_is_fla_0_6s_hopper_refusal(cap, triton, refused):
    assert H.in_window(cap, triton) is refused


def test_only_checked_head_sizes_are_covered():
    assert H.block_width(128) == 128 == H.fla_block_width(128)  # Qwen3.5's K: fla's own width
    assert H.fla_block_width(64) == 64  # issue 640's miscompiled width: never launched
    for k in (16, 32, 64, 100, 256):
        assert H.block_width(k) is None
    assert H.coverage_refusal([128, 128]) is None
    line = H.coverage_refusal([128, 64])
    assert "linear_key_head_dim=64" in line and "speed.fla_kernels=false" in line and "\n" not in line


def test_require_covered_is_one_config_error_where_the_window_applies(monkeypatch):
    monkeypatch.setattr(H, "hopper_refusal", lambda dims: H.coverage_refusal(dims))  # as on an H200 with Triton 3.6
    H.require_covered([128])
    with pytest.raises(ConfigError, match="linear_key_head_dim=64"):
        H.require_covered([64])


def test_the_key_head_size_comes_from_the_config():
    assert linear_key_head_dims(load_config(ROOT / "configs/sft_qwen3_5_27b.yaml", []).model.llm) == [128]
    assert linear_key_head_dims(load_config(ROOT / "configs/sft_qwen3_1p7b.yaml", []).model.llm) == []
    cfg = load_config(ROOT / "configs/sft_demo.yaml", ["model.llm.config={model_type: qwen3_5_text, vocab_size: 392}"])
    assert linear_key_head_dims(cfg.model.llm) == [128]  # the config class's default
