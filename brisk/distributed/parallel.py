"""How a model runs on several ranks, applied from outside the plain model; each choice is logged. Which
choices go together (graphs need ddp, fresh_grads needs one rank, fsdp runs eagerly) is decided in
brisk/plan.py before any model exists.

- ddp (default): torch's DistributedDataParallel around the model (eager and compiled steps).
- speed.cuda_graph: no wrapper. DDP's backward hooks cannot live inside a captured graph, so the graphed
  step averages the gradients itself (distributed.sync.GradSync: one flat buffer per dtype, all-reduced inside
  the graph, given to the step as its ``sync_grads`` hook), rank 0's parameters are broadcast once (as DDP's
  constructor does), and every rank's batch is padded to the ranks' common bucket (distributed.sync.ShapeSync)
  so that all ranks replay the same graph.
- fsdp: FSDP2 (``fully_shard``) for decoders that do not fit comfortably with DDP (see distributed/fsdp.py).
"""

from __future__ import annotations

import torch

from ..config import Config
from ..families import family_of
from .sync import GradSync, ShapeSync, broadcast_params


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def apply_parallel(model: torch.nn.Module, cfg: Config, device: torch.device, world: int):
    """Returns (the module the step calls, a ShapeSync or None, a GradSync or None, notes)."""
    if world == 1:
        if cfg.train.parallel != "ddp":
            return model, None, None, [f"train.parallel={cfg.train.parallel}: one process, nothing to shard"]
        return model, None, None, []
    if cfg.speed.cuda_graph:
        broadcast_params(model)
        sync = GradSync(trainable(model))
        sync.warm()  # the communicator exists before any graph captures an all-reduce
        return model, ShapeSync(), sync, [
            f"parallel: {world} ranks, graphed step with an in-graph gradient all-reduce ({len(sync.buffers)} flat "
            "buffer(s), no DDP wrapper); batches padded to the ranks' common bucket"]
    if cfg.train.parallel == "fsdp":
        from .fsdp import apply_fsdp

        return model, None, None, [apply_fsdp(model, cfg, device)]
    unused = any(p.requires_grad for m in family_of(cfg).outside_loss(model) for p in m.parameters())
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                                    find_unused_parameters=unused)
    return net, None, None, [f"parallel: {world} ranks, DistributedDataParallel"]
