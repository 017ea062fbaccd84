"""A model to decode with, from a run folder, a FunASR model folder or a native HF folder."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..config import ConfigError, load_config
from ..data.loader import load_tokenizer
from ..formats.run_folder import folder_kind, run_weights
from ..formats.run_config import check_run_files
from ..models.build import build_model, read_state_dict

log = logging.getLogger("brisk")


def chat_folder_overrides(path: Path) -> list[str]:
    """A causal LM folder as a chat model: its weights and tokenizer, and the keys its brisk.json recorded
    (the chat template, max_len, dtype the run trained with)."""
    from ..formats.brisk_keys import read_keys_file

    found = read_keys_file(path) or {"keys": {}}
    keys = {k: v for k, v in found["keys"].items() if k.startswith(("data.", "model.llm."))}
    return ["model.family=causal_lm", "train.export=hf", f"model.llm.path={path}", f"data.tokenizer={path}",
            *(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in keys.items())]


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
        weights = run_weights(path, weights, cfg.train.keep_metric)
        check_run_files(path, weights)  # config.yaml and the checkpoint describe the same model, or one line
        model = build_model(cfg.model)
        if weights is not None:
            state = read_state_dict(weights)
            own = model.state_dict()
            shapes = [f"{k} {tuple(v.shape)} (the model: {tuple(own[k].shape)})" for k, v in state.items()
                      if k in own and own[k].shape != v.shape]
            if shapes:
                raise ConfigError(f"{weights}: {len(shapes)} tensors do not fit the model {path / 'config.yaml'} "
                                  f"describes, e.g. {shapes[0]}")
            unknown = sorted(set(state) - set(own))
            if unknown:
                raise ConfigError(f"{weights}: {len(unknown)} keys the run's model lacks (e.g. {unknown[:3]})")
            model.load_state_dict(state, strict=False)
            log.info("loaded %d tensors from %s", len(state), weights)
    elif kind == "lm":
        cfg = load_config(None, [*chat_folder_overrides(path), *(overrides or [])])
        model = build_model(cfg.model)
    else:
        cfg = load_config(None, [f"model.path={path}", *(overrides or [])])
        model = build_model(cfg.model)
    return model.to(device).eval(), load_tokenizer(cfg), cfg

