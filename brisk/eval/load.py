"""A model to decode with, from a run folder, a FunASR model folder or a model family's transformers folder."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..config import ConfigError, load_config
from ..config.roles import resume_roles
from ..data.loader import load_tokenizer
from ..families import folder_family, names
from ..formats.run_folder import folder_kind, run_weights
from ..formats.run_config import check_run_files
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
        weights = run_weights(path, weights, cfg.train.keep_metric)
        # config.yaml and the checkpoint describe the same model, or one line
        check_run_files(path, weights, resume_roles())
        model = build_model(cfg)
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
    else:  # a FunASR folder, or a family's transformers folder (the family says how it loads)
        cfg = load_config(None, [*folder_overrides(path, kind), *(overrides or [])])
        model = build_model(cfg)
    return model.to(device).eval(), load_tokenizer(cfg), cfg


def folder_overrides(path: Path, kind: str) -> list[str]:
    """The config overrides that load a model folder: a FunASR folder as model.path; a transformers folder as
    the family its config.json's model_type names (brisk.families.folder_family) loads it."""
    if kind == "funasr":
        return [f"model.path={path}"]
    family = folder_family(path)
    if family is None:
        raise ConfigError(f"{path / 'config.json'}: no model family loads this folder (families: {', '.join(names())})")
    return family.folder_overrides(path)

