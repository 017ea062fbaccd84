"""What several ranks (torch.distributed) agree on besides DDP's gradients: batch shapes and, for the CUDA-graph
step, the gradient all-reduce itself.

Shapes (``ShapeSync``): a CUDA graph replays fixed shapes, and a graphed step with a collective inside must
be replayed by every rank at the same time, so every rank's batch has to land in the same static bucket.
Each step the ranks all-reduce (MAX) five integers (row length, speech frames, speech segments, cu_seqlens
entries, labelled positions) and pad their batch up to the result; the labelled positions' maximum goes into
``Batch.label_rows_floor``, so that under speed.label_head every rank gathers the same number of rows (a rank
whose batch alone overflowed its bucket's rows would otherwise replay, or capture, a graph of its own). Why this and not a sampler that plans all ranks' batches
together: the sampler sees speech_length + text_length from the jsonl, not the LLM token count of the built
prompt (system prompt, context header, multi-turn, skipped bad samples), so it cannot know the bucket; the
collated batch does. The all-reduce runs on a gloo group over CPU tensors, so it never waits on the GPU
stream (an NCCL all-reduce read back to the host would be a device sync per step); its cost is one small
host round trip, which the ranks' gradient all-reduce makes them wait for anyway.

Gradients (``GradSync``): DDP's semantics without DDP's hooks, for a step captured whole in a CUDA graph.
The trainable parameters' gradients become views into one flat buffer per dtype; after backward each buffer
is divided by the world size and all-reduced with SUM (what DDP's default reducer does: the average of the
ranks' gradients), one collective per dtype, inside the graph (NCCL supports capture once the communicator
exists; ``warm`` runs one all-reduce eagerly before capture).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist

from ..formats.batch import Batch
from ..data.collate import pad_static, static_needs

log = logging.getLogger("brisk")


class ShapeSync:
    """Pads each rank's static packed batch to the ranks' common shapes (one 5-integer all-reduce a batch)."""

    def __init__(self, group=None):
        # A CPU group: the default NCCL group would need a device tensor and a sync to read the answer.
        if group is None and dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo")
        self.group = group
        self.padded = 0  # batches that grew to match another rank (how much the sync costs in padding)

    def __call__(self, batch: Batch) -> Batch:
        need = torch.tensor(static_needs(batch) + [batch.n_label_tokens], dtype=torch.long)
        dist.all_reduce(need, op=dist.ReduceOp.MAX, group=self.group)
        if batch.n_utts == 0 or batch.layout != "packed":
            return batch
        *shapes, labelled = need.tolist()
        out = pad_static(batch, *shapes)
        self.padded += out is not batch
        return dataclasses.replace(out, label_rows_floor=labelled) if labelled != out.label_rows_floor else out


def close_process_group(step_fn) -> None:
    """The end of a run under torch.distributed: the step's CUDA graphs go first, then the process group.

    A live graph that captured an NCCL all-reduce keeps its communicator in use, and destroying the group then
    hangs every rank (pytorch/pytorch#115388; the graphed 2-GPU test did not finish on 2 H200s)."""
    release = getattr(step_fn, "release", None)
    try:
        if release is not None:
            log.info("cuda_graph: released %d graphs before closing the process group", release())
    finally:
        dist.destroy_process_group()


def broadcast_params(model: torch.nn.Module, src: int = 0) -> None:
    """Rank 0's parameters and buffers on every rank (what DDP's constructor does)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src)


class GradSync:
    """Average the gradients of ``params`` over ranks with one all-reduce per dtype on a flat buffer.

    After construction ``p.grad`` is a view into the flat buffer of its dtype and must stay one: zero it in
    place (``zero_grad(set_to_none=False)``), never set it to None. Autograd accumulates into an existing
    gradient in place, so backward writes straight into the buffers.
    """

    def __init__(self, params: list[torch.nn.Parameter], group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.buffers: list[torch.Tensor] = []
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, ps in by_dtype.items():
            flat = torch.zeros(sum(p.numel() for p in ps), dtype=dtype, device=ps[0].device)
            off = 0
            for p in ps:
                view = flat[off:off + p.numel()].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                off += p.numel()
            self.buffers.append(flat)
        log.info("grad_sync: %d flat gradient buffer(s) (%s), averaged over %d ranks",
                 len(self.buffers), ", ".join(f"{b.numel() / 1e6:.1f}M {b.dtype}" for b in self.buffers), self.world)

    def warm(self) -> None:
        """One eager all-reduce: creates the communicator before any graph capture."""
        t = torch.zeros(1, device=self.buffers[0].device)
        dist.all_reduce(t, group=self.group)

    def __call__(self, grads: list[torch.Tensor] | None = None) -> None:
        """``grads`` (the step body's list) are views into the buffers: reducing the buffers reduces them."""
        for flat in self.buffers:
            flat.div_(self.world)  # DDP divides before summing (keeps bf16 sums in range)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
