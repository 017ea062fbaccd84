"""speed.optimizer_in_backward: each decoder layer's parameters updated as soon as their gradients are final.

AdamW is memory-bound (it reads and writes the parameter, gradient and two moments of every parameter);
the backward is mostly GEMMs. Updating layer i while the backward of the layers below it runs lets the two
overlap instead of running one after the other at the end of the step.

What stays the same, so that nothing saved changes: the ONE ``torch.optim.AdamW`` (fused) and its state. A
bucket (one decoder layer's trainable parameters) is updated with the very call ``AdamW.step`` makes for a
group: the optimizer's own ``_init_group`` (lazy state, the step counter on the device) and torch's functional
``adam(..., fused=True)`` (step counters incremented, the fused kernel, found_inf subtracted back). The kernel
is elementwise per parameter, so splitting a group into buckets gives the same bits. Everything that is not
in a decoder layer (embedding / tied LM head, final norm, a trainable encoder or adaptor) is the last bucket,
updated in the step body after the backward, as the plain step updates everything.

How a bucket is issued (from a ``register_post_accumulate_grad_hook`` on each parameter, once the last of the
bucket's gradients has been accumulated, and only while the step has armed the updater: the last micro-batch's
backward under gradient accumulation):

- the bucket's per-tensor gradient norms (``torch._foreach_norm``, as the step's own norm takes them) and its
  non-finite flag go on one side stream, the update on a second one that waits for the first; the main
  stream goes on with the backward. The step's global norm then only waits for the norm stream (the updates
  go on), and the main stream waits for the update stream before the body returns. Events and
  ``wait_stream`` only, no host sync: the same body is captured into CUDA graphs (speed.cuda_graph). On the
  CPU everything runs inline.
- gradients are kept until the step's end: the global norm (metrics["grad_norm"]) and the probe's per-group
  norms are computed from the per-tensor norms taken before each update, i.e. before any clipping.

Semantics that differ from the plain step (docs/finetune-speed.md):

- non-finite gradients: the plain step skips the whole step (found_inf of the global norm). Here the layers
  are updated top-down as the backward reaches them, so a layer whose gradients are not finite skips its own
  update and every later bucket of that step skips too (the flag is cumulative; the last bucket uses the
  global flag). Layers above the first non-finite one (their backward came first) keep their update.
  metrics["skipped"] is the global flag, as before.
- clipping (optim.grad_clip > 0) needs the global norm before the first update: refused unless
  speed.clip_by_previous_norm=true, which clips every bucket by the last finite global norm of an earlier
  step (the kernel's grad_scale, as the plain fused path clips). The first step of a run is not clipped; a
  checkpoint keeps the norm, so a resumed run clips as the uninterrupted one does.
- several ranks (DDP / FSDP): refused in the plan (gradients would be updated before they are reduced).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from torch.optim.adam import adam

from .grad_norms import tensor_norms


def layer_buckets(layers: nn.ModuleList, params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """The trainable parameters of each decoder layer, last layer first (the order the backward reaches them);
    layers without a trainable parameter are left out."""
    trainable = {id(p) for p in params}
    out = []
    for layer in reversed(list(layers)):
        bucket = [p for p in layer.parameters() if id(p) in trainable]
        if bucket:
            out.append(bucket)
    return out


class OptimizerInBackward:
    """StepHooks.in_backward: the step arms it before the last backward, reads the per-tensor norms from it,
    and has it finish the update (``finish``) instead of calling ``optimizer.step``."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter],
                 buckets: list[list[nn.Parameter]], *, grad_clip: float = 0.0):
        if not all(g.get("fused") and "decoupled_weight_decay" in g for g in optimizer.param_groups):
            raise ValueError("speed.optimizer_in_backward issues torch's fused AdamW kernel: the optimizer must be "
                             "torch's AdamW(fused=True) (an Adam subclass, as in torch >= 2.11)")
        self.optimizer, self.params, self.grad_clip = optimizer, params, grad_clip
        self.index = {id(p): i for i, p in enumerate(params)}
        self.buckets = [b for b in buckets if b]
        self.bucket_of = {id(p): k for k, b in enumerate(self.buckets) for p in b}
        self.rest = [p for p in params if id(p) not in self.bucket_of]  # the last bucket, updated in the body
        dev = params[0].device
        self.device = dev
        self.norms = torch.zeros(len(params), device=dev)  # per-tensor gradient norms of this step, params order
        self.found = torch.zeros(len(self.buckets), device=dev)  # each bucket's found_inf (cumulative)
        self.scale = torch.ones((), device=dev)  # the kernel's grad_scale (clip by the previous norm)
        self.previous = torch.zeros((), device=dev)  # the last finite global norm (0: none yet)
        self.slots = [torch.tensor([self.index[id(p)] for p in b], device=dev) for b in self.buckets]
        self._slots: dict[tuple[int, ...], torch.Tensor] = {}  # other sets of positions (made outside capture)
        cuda = dev.type == "cuda"
        self.norm_stream = torch.cuda.Stream(dev) if cuda else None
        self.update_stream = torch.cuda.Stream(dev) if cuda else None
        self.armed = False
        self.count = [0] * len(self.buckets)
        self.issued = [False] * len(self.buckets)
        self.last: int | None = None  # the bucket issued last this step (its found_inf carries on)
        self._ordered = 0  # state entries already put in parameter order
        self.handles = [p.register_post_accumulate_grad_hook(self._accumulated) for b in self.buckets for p in b]
        self.sizes = [len(b) for b in self.buckets]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def previous_norm(self) -> float:
        """The norm the next step clips by (0: none, not clipped); a checkpoint keeps it (exact resume)."""
        return float(self.previous)

    def set_previous_norm(self, norm: float) -> None:
        """In place: a captured step graph reads this very tensor."""
        self.previous.fill_(norm)

    # ------------------------------------------------------------------------------------ the step
    def arm(self) -> None:
        """Before the backward that makes the step's final gradients."""
        self.armed, self.last = True, None
        self.count = [0] * len(self.buckets)
        self.issued = [False] * len(self.buckets)
        if self.grad_clip > 0:  # grads / scale == grads * min(1, clip / (norm + 1e-6)), as the plain step clips
            self.scale.copy_(torch.clamp((self.previous + 1e-6) / self.grad_clip, min=1.0))

    def _accumulated(self, p: torch.Tensor) -> None:
        if not self.armed:
            return
        k = self.bucket_of[id(p)]
        self.count[k] += 1
        if self.count[k] == self.sizes[k] and not self.issued[k]:
            self._issue(k)

    def _streams(self):
        if self.norm_stream is None:
            return nullcontext, nullcontext
        return (lambda: torch.cuda.stream(self.norm_stream)), (lambda: torch.cuda.stream(self.update_stream))

    def _slot_index(self, positions: tuple[int, ...]) -> torch.Tensor:
        t = self._slots.get(positions)
        if t is None:  # first made by an eager step (before any capture: a graph cannot copy from the host)
            t = self._slots[positions] = torch.tensor(positions, device=self.device)
        return t

    @torch.no_grad()
    def _issue(self, k: int) -> None:
        """Bucket k's norms and update, once every one of its parameters has its gradient (the hooks count)."""
        bucket = self.buckets[k]
        self.issued[k] = True
        on_norms, on_updates = self._streams()
        main = torch.cuda.current_stream(self.device) if self.norm_stream is not None else None
        if main is not None:
            self.norm_stream.wait_stream(main)
        with on_norms():
            per = tensor_norms([p.grad for p in bucket])
            self.norms.index_copy_(0, self.slots[k], per)
            bad = torch.isfinite(per.sum()).logical_not().float()
            # cumulative: once a layer is not finite, the layers below it skip too
            self.found[k].copy_(bad if self.last is None else torch.maximum(bad, self.found[self.last]))
        self.last = k
        if main is not None:
            self.update_stream.wait_stream(self.norm_stream)
        with on_updates():
            self._update(bucket, self.found[k])

    @torch.no_grad()
    def _update(self, params: list[nn.Parameter], found_inf: torch.Tensor) -> None:
        """``AdamW.step`` for these parameters: the optimizer's own state initialisation and the call it makes."""
        opt = self.optimizer
        groups = opt.param_groups  # looked up each time: load_state_dict replaces the group dicts
        for group in groups:
            if len(groups) == 1:
                mine = params
            else:
                ids = {id(p) for p in group["params"]}
                mine = [p for p in params if id(p) in ids]
            if not mine:
                continue
            ps, grads, avgs, sqs, maxs, steps = [], [], [], [], [], []
            has_complex = opt._init_group({**group, "params": mine}, ps, grads, avgs, sqs, maxs, steps)
            beta1, beta2 = group["betas"]
            adam(ps, grads, avgs, sqs, maxs, steps, amsgrad=group["amsgrad"], has_complex=has_complex,
                 beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                 maximize=group["maximize"], foreach=group["foreach"], capturable=group["capturable"],
                 differentiable=group["differentiable"], fused=group["fused"],
                 grad_scale=self.scale if self.grad_clip > 0 else None, found_inf=found_inf,
                 decoupled_weight_decay=group["decoupled_weight_decay"])

    def _pending(self) -> list[nn.Parameter]:
        """Parameters with a gradient not yet updated this step: the last bucket and any layer whose hooks did
        not all fire (a parameter without a gradient this step)."""
        out = [p for p in self.rest]
        for k, b in enumerate(self.buckets):
            if not self.issued[k]:
                out += b
        return [p for p in out if p.grad is not None]

    @torch.no_grad()
    def tensor_norms(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Per-tensor norms of ``grads`` (the step's gradients, in parameter order), taken before any update:
        the layers' from the norm stream, the rest's now, on the main stream."""
        if self.norm_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.norm_stream)
        rest = self._pending()
        if rest:
            per = tensor_norms([p.grad for p in rest])
            self.norms.index_copy_(0, self._slot_index(tuple(self.index[id(p)] for p in rest)), per)
        if len(grads) == len(self.params):
            return self.norms
        present = tuple(i for i, p in enumerate(self.params) if p.grad is not None)
        return self.norms.index_select(0, self._slot_index(present))

    @torch.no_grad()
    def finish(self, norm: torch.Tensor) -> torch.Tensor:
        """The last bucket's update (with the global found_inf), then the main stream joins the updates.
        Returns found_inf (1.0: the step's gradients were not all finite)."""
        found = (~torch.isfinite(norm)).to(torch.float32)
        rest = self._pending()
        for k in range(len(self.buckets)):
            self.issued[k] = True
        if rest:
            self._update(rest, found)
        if self.update_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.update_stream)
        if self.grad_clip > 0:
            self.previous.copy_(torch.where(torch.isfinite(norm), norm.float(), self.previous))
        self.armed = False
        self._in_params_order()
        return found

    def _in_params_order(self) -> None:
        """Lazily created state entries come in bucket order; AdamW's own step makes them in parameter order,
        and state_dict keeps that order: put them back in it (once, when new entries were made)."""
        state = self.optimizer.state
        if len(state) == self._ordered:
            return
        self._ordered = len(state)
        for p in self.params:
            if p in state:
                state[p] = state.pop(p)


def apply_optimizer_in_backward(layers: nn.ModuleList, optimizer: torch.optim.Optimizer, params: list[nn.Parameter],
                                grad_clip: float) -> tuple[OptimizerInBackward, str]:
    """The updater for a model's decoder ``layers`` (its family's decoder_layers; the step's StepHooks.in_backward)
    and the note of what it does."""
    buckets = layer_buckets(layers, params)
    ib = OptimizerInBackward(optimizer, params, buckets, grad_clip=grad_clip)
    n = sum(len(b) for b in ib.buckets)
    clip = (f"; clipped by the previous step's norm (optim.grad_clip={grad_clip})" if grad_clip > 0 else "")
    return ib, (f"optimizer_in_backward: {len(ib.buckets)} decoder layers ({n} tensors) updated by fused AdamW "
                f"as their gradients are final, on a side stream; {len(ib.rest)} other tensors after the backward"
                f"{clip}")
