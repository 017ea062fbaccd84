"""speed.fresh_grads is a CUDA-graph option: off by default, refused without cuda_graph (the graphed path itself
is checked on the GPU in tests/gpu/test_label_head_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError

from .conftest import tiny_config


def test_fresh_grads_is_off_by_default_and_needs_cuda_graph(tmp_path):
    assert tiny_config(tmp_path).speed.fresh_grads is False
    with pytest.raises(ConfigError, match="speed.fresh_grads needs speed.cuda_graph"):
        tiny_config(tmp_path, **{"speed.fresh_grads": True})


def test_fresh_grads_refused_with_several_ranks(tmp_path):
    """Several ranks average gradients in flat persistent buffers (GradSync) that fresh gradients would bypass."""
    from brisk.models.build import build_model
    from brisk.train.parallel import apply_parallel

    cfg = tiny_config(tmp_path, **{"speed.packing": True, "speed.cuda_graph": True, "speed.fresh_grads": True})
    with pytest.raises(ConfigError, match="speed.fresh_grads with 2 ranks"):
        apply_parallel(build_model(cfg.model), cfg, torch.device("cpu"), 2)  # refused before any collective
