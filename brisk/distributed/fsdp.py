"""train.parallel=fsdp: FSDP2 (``fully_shard``, torch >= 2.6) for decoders too large for comfortable DDP.

Applied from outside the plain model, torchtitan's way: each decoder layer is its own FSDP unit (its
parameters all-gathered just before its forward/backward and freed after), then the whole model is the
root unit (embeddings, final norm, the tied head, and any trainable audio module). The model is the root,
not the LLM, because the token embeddings run in the model's forward before the LLM. Frozen modules (the
encoder and adaptor in FunASR's recipe) are left out (``ignored_params``): replicated, not sharded, so the
frozen audio path (speed.frozen_eval) can call them outside the root's forward.

What is saved does not change: checkpoints and exports hold the full, unsharded state dict (gathered with
get_model_state_dict(full_state_dict=True, cpu_offload=True), which only rank 0 receives), with the same
keys and shapes as a single-process run.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..config import Config, ConfigError
from ..families import get as get_family
from ..models.lm import human, param_count


def decoder_layers(model: nn.Module, cfg: Config) -> nn.ModuleList:
    """The decoder layers, where the model family says they are."""
    try:
        layers = get_family(cfg.model.family).decoder_layers(model)
    except AttributeError:
        layers = None
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError("train.parallel=fsdp: the LLM has no model.layers list (a transformers decoder-only LM)")
    return layers


def apply_fsdp(model: nn.Module, cfg: Config, device: torch.device) -> str:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if "ignored_params" not in inspect.signature(fully_shard).parameters:
        raise ConfigError(f"train.parallel=fsdp needs torch >= 2.7 (fully_shard's ignored_params); this is {torch.__version__}")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    layers = decoder_layers(model, cfg)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    frozen = {p for m, f in model.freeze_plan().items() if f for p in m.parameters()}
    fully_shard(model, mesh=mesh, ignored_params=frozen)
    n_frozen = sum(p.numel() for p in frozen)
    total = param_count(model)  # a sharded parameter's numel is its full size
    return (f"parallel: FSDP2 over {dist.get_world_size()} ranks: {len(layers)} decoder layers + the root "
            f"({human(total - n_frozen)} parameters sharded; {human(n_frozen)} frozen, replicated)")


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The unsharded model and optimizer state on rank 0 (CPU tensors; empty dicts elsewhere). A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=opts)
    return model_sd, (_by_index(optim_sd) if optim_sd else optim_sd)


def _by_index(optim_sd: dict) -> dict:
    """FQN-keyed optimizer state -> torch's own layout (parameters numbered in param-group order), the layout a
    DDP or single-process checkpoint has, so checkpoints move between the two."""
    index: dict[str, int] = {}
    groups = []
    for g in optim_sd["param_groups"]:
        groups.append({**g, "params": [index.setdefault(fqn, len(index)) for fqn in g["params"]]})
    return {"state": {index[k]: v for k, v in optim_sd["state"].items()}, "param_groups": groups}


def _by_name(model: nn.Module, optimizer: torch.optim.Optimizer, optim_sd: dict) -> dict:
    names = {p: n for n, p in model.named_parameters()}
    fqns = [names[p] for g in optimizer.param_groups for p in g["params"]]
    groups = [{**g, "params": [fqns[i] for i in g["params"]]} for g in optim_sd["param_groups"]]
    return {"state": {fqns[i]: v for i, v in optim_sd["state"].items()}, "param_groups": groups}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict) -> None:
    """Every rank holds the full checkpoint; each keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_sd, options=opts)
    set_optimizer_state_dict(model, optimizer, _by_name(model, optimizer, optim_sd), options=opts)
