"""Fun-ASR-Nano built from a config: seeded random initialisation, then the weights the config names (a FunASR
folder's model.pt, a transformers-native folder, model.init), or straight from one file that holds every weight."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import torch
from torch import nn

from ...config import ModelConfig
from .config import FunAsrNanoConfig
from ...formats.hf import is_hf_folder
from ...models.build import (after_loading, build_llm, check_shapes, has_hf_weights, load_hf_llm_weights,
                             load_weights, read_state_dict, with_adapters)
from .hf_native import from_hf, load_hf_weights
from .model import SpeechLLM

log = logging.getLogger("brisk")

def build_speech_model(cfg: ModelConfig, own: FunAsrNanoConfig, device: torch.device | str | None = None
                       ) -> nn.Module:
    """Fun-ASR-Nano: the model with its random initialisation (seeded), then any weights the config names.

    With ``device`` the parameters are created there directly (a 0.8B model initialises on a GPU in a
    second rather than ~15 s on the CPU); the random values then come from that device's generator.
    When one file (model.init, else the folder's model.pt) holds every weight, the random values would
    all be overwritten: the parameters are then made without values (meta), allocated once in their
    final dtype on ``device`` and filled from the file (see build_from_file).
    """
    full = Path(cfg.init) if cfg.init else (Path(cfg.path) / "model.pt" if cfg.path else None)
    if full is not None and full.is_file():
        model = build_from_file(cfg, own, full, device)
        if model is not None:
            return model
    torch.manual_seed(cfg.seed)  # the random initialisation is part of the run's definition
    with torch.device(device or "cpu"):
        model = with_adapters(SpeechLLM(cfg, own, build_llm(cfg)), cfg)
    if cfg.llm.path and cfg.llm.load_weights and has_hf_weights(Path(cfg.llm.path)):
        load_hf_llm_weights(model, Path(cfg.llm.path))
    if cfg.path and (Path(cfg.path) / "model.pt").is_file():
        load_weights(model, Path(cfg.path) / "model.pt")
    elif cfg.path and is_hf_folder(cfg.path):  # transformers-native layout: map the keys back
        load_weights(model, Path(cfg.path), from_hf(load_hf_weights(cfg.path), own))
    if cfg.init:
        load_weights(model, Path(cfg.init))
    return after_loading(model, cfg)


def build_from_file(cfg: ModelConfig, own: FunAsrNanoConfig, path: Path, device=None) -> SpeechLLM | None:
    """The model built without random values and loaded from ``path``; None when the file lacks a weight
    (then the seeded random initialisation is needed and build_model takes its usual path)."""
    t0 = time.perf_counter()
    state = read_state_dict(path)
    t1 = time.perf_counter()
    with _params_on_meta(), torch.device(device or "cpu"):
        model = with_adapters(SpeechLLM(cfg, own, build_llm(cfg)), cfg)
    t2 = time.perf_counter()
    params = dict(model.named_parameters(remove_duplicate=False))
    first = {}  # a tied weight (lm_head = embed_tokens) is one Parameter under two names
    for name, p in params.items():
        first.setdefault(id(p), name)
    covered = {id(p) for n, p in params.items() if n in state}
    if any(id(p) not in covered for p in params.values()) or set(state) - set(model.state_dict()):
        return None
    made: dict[int, nn.Parameter] = {}
    for mname, module in model.named_modules():
        for pname, p in list(module._parameters.items()):
            if p is not None and p.device.type == "meta":
                if id(p) not in made:
                    made[id(p)] = nn.Parameter(torch.empty_like(p, device=device or "cpu"), requires_grad=p.requires_grad)
                module._parameters[pname] = made[id(p)]
    check_shapes(model, state, path)
    with torch.no_grad():
        own = model.state_dict()
        for k, v in state.items():
            own[k].copy_(v)  # into the parameter's own dtype and device
    log.info("loaded %d tensors from %s (built without random init: the file holds every weight; read %.1f s, "
             "modules %.1f s, filled %.1f s)", len(state), path, t1 - t0, t2 - t1, time.perf_counter() - t2)
    return after_loading(model, cfg)


@contextlib.contextmanager
def _params_on_meta():
    """Parameters are created on the meta device (no memory, no init compute); buffers stay real, since
    non-persistent ones (rotary inv_freq) are computed at construction and are in no weights file."""
    register = nn.Module.register_parameter

    def to_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = to_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register
