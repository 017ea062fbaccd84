"""How a model runs on several ranks, applied from outside the plain model; each choice is logged.

- ddp (default): torch's DistributedDataParallel around the model (eager and compiled steps).
- speed.cuda_graph: no wrapper. DDP's backward hooks cannot live inside a captured graph, so the graphed
  step averages the gradients itself (distributed.sync.GradSync: one flat buffer per dtype, all-reduced inside the
  graph), rank 0's parameters are broadcast once (as DDP's constructor does), and every rank's batch is
  padded to the ranks' common bucket (distributed.sync.ShapeSync) so that all ranks replay the same graph.
- fsdp: FSDP2 (``fully_shard``) for decoders that do not fit comfortably with DDP (see distributed/fsdp.py).
"""

from __future__ import annotations

import torch

from ..config import Config, ConfigError
from .sync import GradSync, ShapeSync, broadcast_params


def apply_parallel(model: torch.nn.Module, cfg: Config, device: torch.device, world: int):
    """Returns (the module the step calls, a ShapeSync or None, notes)."""
    if world == 1:
        if cfg.train.parallel != "ddp":
            return model, None, [f"train.parallel={cfg.train.parallel}: one process, nothing to shard"]
        return model, None, []
    if cfg.speed.cuda_graph:
        if cfg.train.parallel != "ddp":
            raise ConfigError(f"train.parallel={cfg.train.parallel} with speed.cuda_graph: the graphed step averages "
                              "gradients DDP-style only; use train.parallel=ddp")
        if cfg.speed.fresh_grads:
            # GradSync all-reduces one flat buffer that every gradient is a view of; fresh gradients are new
            # tensors each step, and copying them in would cost the adds fresh_grads removes.
            raise ConfigError(f"speed.fresh_grads with {world} ranks: the in-graph all-reduce needs persistent "
                              "gradient buffers; set speed.fresh_grads=false")
        broadcast_params(model)
        return model, ShapeSync(), [f"parallel: {world} ranks, graphed step with an in-graph gradient all-reduce "
                                    "(no DDP wrapper); batches padded to the ranks' common bucket"]
    if cfg.train.parallel == "fsdp":
        from .fsdp import apply_fsdp

        return model, None, [apply_fsdp(model, cfg, device)]
    unused = model.ctc is not None and not cfg.model.ctc.freeze
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                                    find_unused_parameters=unused)
    return net, None, [f"parallel: {world} ranks, DistributedDataParallel"]


def attach_grad_sync(graphed) -> str:
    """Give a GraphedStep its gradient all-reduce (before its graphs are captured)."""
    if not graphed.step.persistent_grads:
        raise ConfigError("speed.fresh_grads with several ranks: the in-graph all-reduce needs persistent gradient "
                          "buffers; set speed.fresh_grads=false")
    sync = GradSync(graphed.params)
    sync.warm()
    graphed.step.hooks.sync_grads = sync  # the step body's slot between backward and the norms
    return f"grad_sync: {len(sync.buffers)} flat buffer(s) all-reduced inside each step graph"
