"""speed.triton_adamw: AdamW's update as one Triton kernel launch for all of a dtype's tensors.

Why: round 14's profile of the speech preset put torch's fused AdamW at 3.5 ms of a 26.5 ms step: ~9.5 GB moved
at ~2.7 TB/s, about half of the H200's HBM rate. Its threads load 4 bf16 values (8 bytes) at a time in chunks of
65,536 elements, and with a clip scale set (grad_scale, how the step clips on the device) it writes every gradient
back divided by the scale, although nothing reads the gradients after the update. This kernel streams 16 bytes a
thread over every tensor in one launch and leaves the gradients as the backward made them: 7 of the 8 passes.

How one launch reaches every tensor: each program updates BLOCK elements of one tensor; a table on the device
gives each tensor's parameter, gradient and moment addresses as element offsets from one base tensor (all are
32-byte aligned allocations of the same dtype), its step counter and its size. Parameters and moments never move;
the gradients are the step's own (speed.fresh_grads: each captured graph has its own), so the table is from host memory each step, which inside a CUDA graph capture becomes a copy node
that replays from the same host buffer (kept for the graph's life).

The same numbers: each element goes through torch's fused AdamW arithmetic for torch >= 2.11
(aten/src/ATen/native/cuda/fused_adam_utils.cuh: fp32 math, the moments' lerps as fma, IEEE division and square
roots, the bias corrections from the tensor's own step count, its pow in double as nvcc builds it). The optimizer is torch's AdamW with its own state,
lr tensor, grad_scale and found_inf: checkpoints do not change. What differs: the gradients keep their values
(torch's kernel leaves them divided by grad_scale). A step before the optimizer has state (the first, eager one
before any capture) is torch's own step, which creates the state.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("brisk")

BLOCK = 8192  # elements a program: per-program work (the table, the bias corrections) over fewer programs
NUM_WARPS = 16  # 16 elements a thread (two 16-byte loads of bf16)
_KERNEL = None


def _kernel():
    """The Triton kernel, built on first use (Triton is imported only where the switch is on)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def update(base, po, go, mo, vo, mask, lr, scale_ptr, beta1, beta2, weight_decay, eps, bias_correction1,
               bias_correction2_sqrt, HAS_SCALE: tl.constexpr, HAS_WD: tl.constexpr, MASKED: tl.constexpr):
        if MASKED:  # the last block of a tensor
            p = tl.load(base + po, mask=mask).to(tl.float32)
            g = tl.load(base + go, mask=mask).to(tl.float32)
            m = tl.load(base + mo, mask=mask).to(tl.float32)
            v = tl.load(base + vo, mask=mask).to(tl.float32)
        else:  # no mask: a mask of unknown alignment would split the 16-byte loads
            p = tl.load(base + po).to(tl.float32)
            g = tl.load(base + go).to(tl.float32)
            m = tl.load(base + mo).to(tl.float32)
            v = tl.load(base + vo).to(tl.float32)
        if HAS_SCALE:
            g = tl.div_rn(g, tl.load(scale_ptr))
        if HAS_WD:  # param -= lr * weight_decay * param, contracted to one fma as nvcc does
            p = tl.fma(-(lr * weight_decay), p, p)
        m = tl.fma(beta1, m, tl.fma(-beta1, g, g))
        gg = g * g
        v = tl.fma(beta2, v, tl.fma(-beta2, gg, gg))
        step_size = tl.div_rn(lr, bias_correction1)
        denom = tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps
        p = p - tl.div_rn(step_size * m, denom)
        out = base.dtype.element_ty
        if MASKED:
            tl.store(base + po, p.to(out), mask=mask)
            tl.store(base + mo, m.to(out), mask=mask)
            tl.store(base + vo, v.to(out), mask=mask)
        else:
            tl.store(base + po, p.to(out))
            tl.store(base + mo, m.to(out))
            tl.store(base + vo, v.to(out))

    @triton.jit
    def adamw_kernel(base, step_base, table, block_tensor, lr_ptr, scale_ptr, inf_ptr,
                     beta1, beta2, weight_decay, eps,
                     HAS_SCALE: tl.constexpr, HAS_INF: tl.constexpr, HAS_WD: tl.constexpr,
                     BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        t = tl.load(block_tensor + pid).to(tl.int64)
        row = table + 7 * t  # offsets of param, grad, exp_avg, exp_avg_sq (elements), step, numel, first block
        n = tl.load(row + 5)
        start = (pid - tl.load(row + 6)) * BLOCK
        local = start + tl.arange(0, BLOCK)
        skip = 0.0
        if HAS_INF:  # torch's kernel returns before touching anything when found_inf == 1
            skip = tl.load(inf_ptr)
        if skip != 1.0:
            lr = tl.load(lr_ptr)
            step = tl.load(step_base + tl.load(row + 4))
            # at::native::pow_(float, float) is ::pow, the double pow, its result rounded to float (the bits say so)
            bias_correction1 = 1.0 - libdevice.pow(beta1.to(tl.float64), step.to(tl.float64)).to(tl.float32)
            bias_correction2 = 1.0 - libdevice.pow(beta2.to(tl.float64), step.to(tl.float64)).to(tl.float32)
            bias_correction2_sqrt = tl.sqrt_rn(bias_correction2)
            po = tl.max_contiguous(tl.multiple_of(tl.load(row + 0) + local, 8), BLOCK)
            go = tl.max_contiguous(tl.multiple_of(tl.load(row + 1) + local, 8), BLOCK)
            mo = tl.max_contiguous(tl.multiple_of(tl.load(row + 2) + local, 8), BLOCK)
            vo = tl.max_contiguous(tl.multiple_of(tl.load(row + 3) + local, 8), BLOCK)
            if start + BLOCK <= n:
                update(base, po, go, mo, vo, None, lr, scale_ptr, beta1, beta2, weight_decay, eps, bias_correction1,
                       bias_correction2_sqrt, HAS_SCALE, HAS_WD, False)
            else:
                update(base, po, go, mo, vo, local < n, lr, scale_ptr, beta1, beta2, weight_decay, eps,
                       bias_correction1, bias_correction2_sqrt, HAS_SCALE, HAS_WD, True)

    _KERNEL = adamw_kernel
    return _KERNEL


class _Launch:
    """One dtype's tensors: the program-to-tensor map (fixed by the sizes) and, each step, the table of offsets.
    Built outside any capture (a copy from pageable memory is not allowed inside one). Inside a capture the table
    comes from one of ``SLOTS`` pinned host buffers allocated here; the graph's copy node reads it at each replay,
    so a slot, once a graph holds it, is never written again."""

    SLOTS = 64  # captured graphs a dtype's tensors can be in (the preset's buckets: 15)

    def __init__(self, params: list[torch.Tensor], steps: list[torch.Tensor]):
        self.base, self.step_base = params[0], steps[0]
        self.sizes = [p.numel() for p in params]
        blocks = [(n + BLOCK - 1) // BLOCK for n in self.sizes]
        self.firsts = [sum(blocks[:i]) for i in range(len(blocks))]
        self.programs = sum(blocks)
        self.block_tensor = torch.repeat_interleave(torch.arange(len(blocks), dtype=torch.int32),
                                                    torch.tensor(blocks)).to(self.base.device)
        self.pinned = torch.empty((self.SLOTS, len(blocks), 7), dtype=torch.int64, pin_memory=True)
        self.used = 0
        self.kept: list[torch.Tensor] = []  # the captured graphs' device tables

    def _offsets(self, tensors: list[torch.Tensor], base: torch.Tensor, align: int) -> list[int] | None:
        size, addr = base.element_size(), base.data_ptr()
        out = []
        for t in tensors:
            d = t.data_ptr() - addr
            if d % align or not t.is_contiguous():
                return None
            out.append(d // size)
        return out

    def table(self, ps, grads, avgs, sqs, steps) -> torch.Tensor | None:
        """The offsets table on the device, or None (a tensor out of line, or no pinned slot left)."""
        cols = [self._offsets(x, self.base, 32) for x in (ps, grads, avgs, sqs)]  # the kernel claims 8 x 4 bytes
        cols.append(self._offsets(steps, self.step_base, 4))
        if any(c is None for c in cols):
            return None
        rows = torch.tensor([[c[i] for c in cols] + [self.sizes[i], self.firsts[i]] for i in range(len(ps))],
                            dtype=torch.int64)
        if not torch.cuda.is_current_stream_capturing():
            return rows.to(self.base.device)
        if self.used == self.SLOTS:
            return None
        host = self.pinned[self.used]
        self.used += 1
        host.copy_(rows)
        dev = torch.empty_like(host, device=self.base.device)
        dev.copy_(host, non_blocking=True)  # a copy node: each replay reads this slot
        self.kept.append(dev)
        return dev


def _supported(ps, grads, avgs, sqs) -> bool:
    dtype = ps[0].dtype
    return (ps[0].is_cuda and dtype in (torch.bfloat16, torch.float16, torch.float32)
            and all(t.dtype == dtype for x in (ps, grads, avgs, sqs) for t in x))


class TritonAdamW(torch.optim.AdamW):
    """torch's AdamW (fused, capturable: lr and step counters on the device) whose update runs brisk's kernel. Same
    constructor, state and state_dict; ``grad_scale`` and ``found_inf`` are read as torch's fused step reads them
    (attributes the caller sets for one step)."""

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("TritonAdamW.step takes no closure")
        first = any(p.grad is not None and not self.state.get(p) for g in self.param_groups for p in g["params"])
        if first:
            super().step()  # torch's own step makes the state (the first step, eager)
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        launches = self.__dict__.setdefault("_launches", {})
        capturing = torch.cuda.is_current_stream_capturing()
        for gi, group in enumerate(self.param_groups):
            for key, sel in self._sets(gi, group):
                launch = launches.get(key)
                if launch is None and not capturing and _supported(*sel[:4]):
                    launch = launches[key] = _Launch(sel[0], sel[4])
                if first:
                    continue
                table = launch.table(*sel) if launch is not None else None
                if table is None:  # a new set inside a capture, or tensors out of line: torch's kernel for this set
                    if key not in self.__dict__.setdefault("_warned", set()):
                        self._warned.add(key)
                        log.warning("speed.triton_adamw: %d %s tensors updated by torch's fused kernel (%s)", len(sel[0]),
                                    sel[0][0].dtype, "first met inside a graph capture" if launch is None and capturing
                                    else "not aligned or not supported")
                    self._torch_update(group, *sel, grad_scale, found_inf)
                    continue
                self._launch(launch, table, group, sel[4], grad_scale, found_inf)
        return None

    def _sets(self, gi: int, group: dict) -> list[tuple[tuple, list[list[torch.Tensor]]]]:
        """(key, [params, grads, exp_avgs, exp_avg_sqs, steps]) for each dtype of the group's tensors with a gradient."""
        ps, grads, avgs, sqs, maxs, steps = [], [], [], [], [], []
        has_complex = self._init_group(group, ps, grads, avgs, sqs, maxs, steps)
        if group["amsgrad"] or group["maximize"] or has_complex or not isinstance(group["lr"], torch.Tensor):
            raise ValueError("speed.triton_adamw covers AdamW without amsgrad or maximize, real parameters and a "
                             "device lr (capturable): the optimizer was built otherwise")
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(ps):
            by_dtype.setdefault(p.dtype, []).append(i)
        return [((gi, dtype, tuple(id(ps[i]) for i in idx), BLOCK), [[x[i] for i in idx] for x in (ps, grads, avgs, sqs, steps)])
                for dtype, idx in by_dtype.items()]
    @staticmethod
    def _launch(launch: _Launch, table, group, steps, grad_scale, found_inf) -> None:
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        dummy = launch.step_base  # pointer arguments the constexpr flags keep unread
        _kernel()[(launch.programs,)](
            launch.base, launch.step_base, table, launch.block_tensor, group["lr"],
            grad_scale if grad_scale is not None else dummy, found_inf if found_inf is not None else dummy,
            beta1, beta2, group["weight_decay"], group["eps"],
            HAS_SCALE=grad_scale is not None, HAS_INF=found_inf is not None, HAS_WD=group["weight_decay"] != 0,
            BLOCK=BLOCK, num_warps=NUM_WARPS)
        if found_inf is not None:  # a skipped step does not count, as in torch's fused path
            torch._foreach_sub_(steps, [found_inf] * len(steps))

    @staticmethod
    def _torch_update(group, ps, grads, avgs, sqs, steps, grad_scale, found_inf) -> None:
        from torch.optim.adam import adam

        beta1, beta2 = group["betas"]
        adam(ps, grads, avgs, sqs, [], steps, amsgrad=False, has_complex=False, beta1=beta1, beta2=beta2,
             lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, foreach=False,
             capturable=True, differentiable=False, fused=True, grad_scale=grad_scale, found_inf=found_inf,
             decoupled_weight_decay=True)
