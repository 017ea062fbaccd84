"""A model to decode with, from a run folder, a FunASR model folder or a native HF folder."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..config import ConfigError, load_config
from ..data.loader import load_tokenizer
from ..formats.run_folder import folder_kind, run_weights
from ..models.build import build_model, read_state_dict

log = logging.getLogger("brisk")


def load_for_inference(path: str | Path, device: str | torch.device = "cpu", overrides: list[str] | None = None,
                       weights: str | None = None):
    """(model in eval mode, tokenizer, Config) from a run folder, a FunASR model folder or a native HF folder.

    A run folder is rebuilt from its saved config (model.path / model.init give the starting weights) and then
    takes its weights (``weights``: see run_weights; by default the newest); a checkpoint that holds only the
    trained weights leaves the frozen ones as built.
    """
    path = Path(path)
    kind = folder_kind(path)
    if kind == "run":
        cfg = load_config(path / "config.yaml", overrides, check_paths=False)  # its data may have moved
        model = build_model(cfg.model)
        weights = run_weights(path, weights, cfg.train.keep_metric)
        if weights is not None:
            state = read_state_dict(weights)
            own = model.state_dict()
            unknown = sorted(set(state) - set(own))
            if unknown:
                raise ConfigError(f"{weights}: {len(unknown)} keys the run's model lacks (e.g. {unknown[:3]})")
            model.load_state_dict(state, strict=False)
            log.info("loaded %d tensors from %s", len(state), weights)
    else:
        cfg = load_config(None, [f"model.path={path}", *(overrides or [])])
        model = build_model(cfg.model)
    return model.to(device).eval(), load_tokenizer(cfg), cfg

