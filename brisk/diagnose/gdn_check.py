"""The Gated DeltaNet kernel check: a kernel's chunked gated delta rule and short causal conv, forward and
backward, against an fp32 per-token recurrence written here in plain torch (it runs on the CPU too).

Compared, per shape: the output and every input gradient (dq, dk, dv, dg, dbeta; for the conv dx and dweight)
as the max abs error and the relative error ||x - ref|| / ||ref||, over the real tokens of a packed row
(varlen, cu_seqlens) or over every row of a padded batch.

The bf16 bound of a tensor is ``BOUND_FACTOR`` times its floor, the larger of two errors that bf16 inputs
cause in an exact computation:
- transformers' torch chunk path (the fallback brisk runs when fla is off) given the same bf16 inputs: it
  computes in fp32 and rounds its output and gradients to bf16 once;
- the fp32 reference itself with every input (and the upstream gradient) moved by a random relative
  perturbation of bf16's unit roundoff (2^-9): how far one bf16 rounding of the inputs moves the tensor,
  its conditioning included (dg sums products that cancel; the torch path keeps dg in fp32, so only this
  term gives dg a floor).
A fused bf16 kernel rounds several intermediate tensors (the chunk states, the WY factors, the partial
gradients), each such rounding adding about one floor: 16x (4 bits) leaves room for that, and a miscompiled
kernel (fla-org/flash-linear-attention#640: errors of the order of the gradient itself, relative ~0.5) is far above it. The
conv's floor is the torch conv in bf16 and the perturbed reference, the same way.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BOUND_FACTOR = 16.0
MIXED = (1, 17, 63, 64, 65, 100, 128, 37, 200, 511, 90, 1500, 2048)  # many short conversations and a few long


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int  # value heads; q and k run repeated to them, as brisk's fla path calls the kernel
    k: int
    v: int
    lengths: tuple[int, ...]  # the conversations of one packed row (varlen), or the rows of a padded batch
    padded: bool = False  # a [B, T] batch of equal rows, no cu_seqlens (the issue-640 reproducers)
    inputs: str = "qwen"  # qwen: Qwen3.5-like gates; uniform: fla#640's reproducer (torch.rand, logsigmoid g)
    conv: int = 4  # short conv width (0: no conv check at this shape)


# Qwen3.5's Gated DeltaNet layers (public config.json: 16 key heads, 16/16/32/48 value heads, K = V = 128,
# conv width 4), each on one packed row of mixed conversation lengths; then fla#640's reproducer shapes.
SHAPES = (
    Shape("qwen3_5_0p8b", 16, 128, 128, MIXED),
    Shape("qwen3_5_2b", 16, 128, 128, MIXED),
    Shape("qwen3_5_9b", 32, 128, 128, MIXED),
    Shape("qwen3_5_27b", 48, 128, 128, MIXED),
    Shape("i640_b2_t256_h4_k128", 4, 128, 128, (256, 256), padded=True, inputs="uniform", conv=0),
    Shape("i640_b2_t1024_h4_k64", 4, 64, 64, (1024, 1024), padded=True, inputs="uniform", conv=0),
    Shape("i640_b1_t63_h2_k64", 2, 64, 64, (63,), padded=True, inputs="uniform", conv=0),
    Shape("tiny_varlen_k64", 4, 64, 64, (5, 64, 130, 300), conv=4),  # brisk's GPU test model (K = 64)
)
CPU_SHAPES = (Shape("cpu_varlen_k32", 2, 32, 32, (1, 9, 64, 70)), Shape("cpu_padded_k16", 2, 16, 16, (40, 40), padded=True))


@dataclass
class Row:
    shape: str
    kernel: str  # e.g. "fla chunk_gated_delta_rule BK 128", "fla causal_conv1d"
    tensor: str
    max_abs: float
    rel: float
    floor: float  # bf16's own relative error for this tensor (see the module docstring)
    seconds: float = 0.0  # the kernel's forward + backward (one timed call after a warm one)

    @property
    def bound(self) -> float:
        return BOUND_FACTOR * max(self.floor, 1e-6)

    @property
    def ok(self) -> bool:
        return self.rel == self.rel and self.rel <= self.bound


# ---------------------------------------------------------------------------------------- reference
def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _steps(state, q, k, v, g, beta):
    """The recurrence over one segment. state: [N, H, K, V]; q, k: [N, s, H, K]; v: [N, s, H, V]; g, beta: [N, s, H]."""
    outs = []
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[..., None, None]
        remembered = torch.einsum("nhk,nhkv->nhv", k[:, t], state)
        delta = (v[:, t] - remembered) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("nhk,nhkv->nhv", q[:, t], state))
    return state, torch.stack(outs, 1)


def gated_delta_rule_reference(q, k, v, g, beta, scale: float | None = None, l2norm_qk: bool = True,
                               segment: int = 64) -> torch.Tensor:
    """o[t] = q[t] S[t], S[t] = exp(g[t]) S[t-1] + k[t] (beta[t] (v[t] - k[t] exp(g[t]) S[t-1])), token by token,
    in the dtype of the inputs (give fp32 or fp64). q, k: [B, T, H, K]; v: [B, T, H, V]; g (log decay), beta:
    [B, T, H]. With autograd, each segment of tokens is recomputed in the backward (the states of every token
    would not fit)."""
    if l2norm_qk:
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    b, t, h, kd = k.shape
    state = q.new_zeros(b, h, kd, v.shape[-1])
    outs = []
    for a in range(0, t, segment):
        parts = (state, q[:, a:a + segment], k[:, a:a + segment], v[:, a:a + segment], g[:, a:a + segment],
                 beta[:, a:a + segment])
        if torch.is_grad_enabled() and any(x.requires_grad for x in parts):
            state, o = torch.utils.checkpoint.checkpoint(_steps, *parts, use_reentrant=False)
        else:
            state, o = _steps(*parts)
        outs.append(o)
    return torch.cat(outs, 1)


def _spans(lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch index, time index) of every token of a packed row, in row order."""
    bi = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    ti = torch.cat([torch.arange(n) for n in lengths])
    return bi, ti


def pad_row(x: torch.Tensor, lengths) -> torch.Tensor:
    """[1, T, ...] packed row -> [N, longest, ...] right-padded batch with zeros (differentiable)."""
    bi, ti = _spans(lengths)
    out = x.new_zeros(len(lengths), max(lengths), *x.shape[2:])
    return out.index_put((bi.to(x.device), ti.to(x.device)), x[0])


def unpad_row(x: torch.Tensor, lengths) -> torch.Tensor:
    bi, ti = _spans(lengths)
    return x[bi.to(x.device), ti.to(x.device)][None]


def varlen_reference(q, k, v, g, beta, lengths, padded: bool = False, dtype=torch.float32) -> torch.Tensor:
    """The reference over a packed row's conversations (each from a zero state) or a padded batch. Zero
    padding after a conversation (decay 1, beta 0) leaves its tokens alone; the padding is dropped."""
    args = [x.to(dtype) for x in (q, k, v, g, beta)]
    if padded:
        return gated_delta_rule_reference(*args)
    return unpad_row(gated_delta_rule_reference(*[pad_row(x, lengths) for x in args]), lengths)


def torch_chunk_function():
    """transformers' torch chunk gated delta rule itself (unwrapped: with fla importable, transformers binds the
    public name to fla's kernel)."""
    try:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    except ImportError:
        from transformers.models.qwen3_next import modeling_qwen3_next as m
    return inspect.unwrap(m.torch_chunk_gated_delta_rule)


def torch_chunk_varlen(q, k, v, g, beta, lengths, padded: bool = False) -> torch.Tensor:
    """transformers' torch chunk path on the row's conversations as one right-padded batch (brisk's batched path)."""
    fn = torch_chunk_function()
    if padded:
        return fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]
    out = fn(*[pad_row(x, lengths) for x in (q, k, v, g, beta)], use_qk_l2norm_in_kernel=True)[0]
    return unpad_row(out, lengths)


def conv_reference(x, weight, lengths, padded: bool = False, dtype=torch.float32) -> torch.Tensor:
    """SiLU of the causal depthwise conv of each conversation from zeros. x: [1, T, D] (or [B, T, D] padded);
    weight: [D, W]."""
    x, weight = x.to(dtype), weight.to(dtype)
    w = weight.shape[-1]
    rows = [x[i] for i in range(x.shape[0])] if padded else torch.split(x[0], list(lengths))
    outs = [F.silu(F.conv1d(r.t()[None], weight[:, None, :], padding=w - 1, groups=weight.shape[0])[0, :, :r.shape[0]]).t()
            for r in rows]
    return torch.stack(outs) if padded else torch.cat(outs)[None]


# ------------------------------------------------------------------------------------------ inputs
def make_inputs(shape: Shape, device, seed: int = 0) -> dict[str, torch.Tensor]:
    """bf16 q, k, v, beta and fp32 g (as brisk's fla path passes them), and the conv's bf16 x and weight, and
    upstream gradients. Qwen-like: q, k, v standard normal (post conv + SiLU scale), beta a sigmoid, g =
    -A softplus(a + dt_bias) with A uniform in (0, 16) per head as Qwen3.5 initialises A_log."""
    gen = torch.Generator().manual_seed(seed)
    t = sum(shape.lengths) if not shape.padded else shape.lengths[0]
    b = len(shape.lengths) if shape.padded else 1
    h = shape.heads

    def rnd(*s):
        return torch.randn(*s, generator=gen)

    if shape.inputs == "uniform":  # fla#640's test: torch.rand inputs, logsigmoid gates, some gates zeroed
        q, k, v = (torch.rand(b, t, h, d, generator=gen) for d in (shape.k, shape.k, shape.v))
        beta = torch.rand(b, t, h, generator=gen).sigmoid()
        g = F.logsigmoid(torch.rand(b, t, h, generator=gen)) * (torch.rand(b, t, h, generator=gen) > 0.5)
    else:
        q, k, v = rnd(b, t, h, shape.k), rnd(b, t, h, shape.k), rnd(b, t, h, shape.v)
        beta = rnd(b, t, h).sigmoid()
        a_decay = torch.rand(h, generator=gen) * 16
        g = -a_decay * F.softplus(rnd(b, t, h) + 1.0)
    out = {"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16(), "g": g.float(), "beta": beta.bfloat16(),
           "do": rnd(b, t, h, shape.v).bfloat16()}
    if shape.conv:
        d = 2 * h * shape.k + h * shape.v
        out.update(x=rnd(b, t, d).bfloat16(), weight=(rnd(d, shape.conv) * 0.5).bfloat16(), dy=rnd(b, t, d).bfloat16())
    return {n: x.to(device) for n, x in out.items()}


# ------------------------------------------------------------------------------------------- the check
def errors(a: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    d = (a.double() - ref.double())
    return float(d.abs().max()), float(d.norm() / ref.double().norm().clamp_min(1e-30))


def grads(fn, leaves: dict[str, torch.Tensor], upstream: torch.Tensor) -> dict[str, torch.Tensor]:
    """fn's output and the gradients of its leaves for the upstream gradient."""
    xs = {n: x.detach().clone().requires_grad_(True) for n, x in leaves.items()}
    out = fn(**xs)
    out.backward(upstream.to(out.dtype))
    return {"o": out.detach(), **{f"d{n}": x.grad.detach() for n, x in xs.items()}}


def timed(fn, *args):
    """fn(*args) once to warm (Triton compiles and autotunes), then timed once."""
    fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return res, time.perf_counter() - t0


def cu_seqlens(shape: Shape, device) -> torch.Tensor | None:
    """The packed row's conversation boundaries (None for a padded batch)."""
    if shape.padded:
        return None
    return torch.tensor([0, *torch.tensor(shape.lengths).cumsum(0).tolist()], device=device, dtype=torch.long)


def _delta_rule(chunk_gated_delta_rule, shape: Shape):
    """fla's call signature, which FlashQLA shares, on the shape's packed row (or padded batch)."""
    def run(q, k, v, g, beta):
        return chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True,
                                      cu_seqlens=cu_seqlens(shape, q.device))[0]
    return run


def fla_delta_rule(shape: Shape):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return _delta_rule(chunk_gated_delta_rule, shape)


def flashqla_delta_rule(shape: Shape):
    """Qwen's FlashQLA (flash-qla: TileLang kernels for SM90, K = V = 128): the same call as fla's, on the same
    packed row. Importing it raises on a GPU it has no kernels for."""
    from flash_qla import chunk_gated_delta_rule

    run = _delta_rule(chunk_gated_delta_rule, shape)
    run.__name__ = "FlashQLA chunk_gated_delta_rule"
    return run


def flashqla_refusal() -> str | None:
    """Why FlashQLA cannot run here, or None: not installed, or its import refuses this GPU (it has kernels for
    SM90, SM100/103 and SM120/121) or lacks what TileLang needs."""
    import importlib.util

    if importlib.util.find_spec("flash_qla") is None:
        return "flash-qla is not installed (pip install 'brisk-train[flashqla]': Qwen's TileLang kernels, SM90 and later)"
    try:
        import flash_qla  # noqa: F401
    except Exception as e:  # noqa: BLE001 - its import probes the GPU and TileLang's compiler
        return f"flash-qla does not load here: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def fla_conv(shape: Shape):
    from fla.modules.causal_conv1d.ops import causal_conv1d

    def run(x, weight):
        return causal_conv1d(x, weight=weight, bias=None, activation="silu", cu_seqlens=cu_seqlens(shape, x.device))[0]
    return run


def torch_conv(shape: Shape):
    def run(x, weight):
        return conv_reference(x, weight, shape.lengths, shape.padded, dtype=x.dtype)
    return run


UNIT_ROUNDOFF = 2.0 ** -9  # bf16


def perturbed(x: torch.Tensor, seed: int) -> torch.Tensor:
    """x in fp32 moved by a uniform random relative perturbation of at most bf16's unit roundoff."""
    gen = torch.Generator().manual_seed(seed)
    u = (torch.rand(x.shape, generator=gen) * 2 - 1).to(x.device)
    return x.float() * (1 + UNIT_ROUNDOFF * u)


def reference_grads(shape: Shape, inputs: dict, dtype=torch.float32, perturb: bool = False) -> dict[str, torch.Tensor]:
    names = ("q", "k", "v", "g", "beta")
    leaves = {n: perturbed(inputs[n], 100 + i) if perturb else inputs[n] for i, n in enumerate(names)}
    upstream = perturbed(inputs["do"], 99) if perturb else inputs["do"]
    return grads(lambda **x: varlen_reference(**x, lengths=shape.lengths, padded=shape.padded, dtype=dtype),
                  leaves, upstream.to(dtype))


def floors(torch_path: dict, ref: dict, sensitivity: dict, tensors) -> dict[str, float]:
    return {t: max(errors(torch_path[t], ref[t])[1], errors(sensitivity[t], ref[t])[1]) for t in tensors}


def check_delta_rule(shape: Shape, device, kernel="fla", seed: int = 0, bk: int | None = None,
                     ref: tuple[dict, dict] | None = None) -> list[Row]:
    """Rows for one kernel of the gated delta rule at one shape. kernel: "fla" (fla's chunk_gated_delta_rule,
    at key-block width bk when given: brisk's launcher forced), "torch_chunk" (transformers' torch chunk path,
    which runs on the CPU), or a function (q, k, v, g, beta) -> o on the packed row (or the padded batch)."""
    inputs = make_inputs(shape, device, seed)
    leaves = {n: inputs[n] for n in ("q", "k", "v", "g", "beta")}
    ref, sens = ref or (reference_grads(shape, inputs), reference_grads(shape, inputs, perturb=True))
    floor = grads(lambda **x: torch_chunk_varlen(**x, lengths=shape.lengths, padded=shape.padded), leaves, inputs["do"])
    if kernel == "torch_chunk":
        got, seconds, name = floor, 0.0, "torch chunk (transformers)"
    elif callable(kernel):
        got, seconds = timed(grads, kernel, leaves, inputs["do"])
        name = getattr(kernel, "__name__", "kernel")
    else:
        run = fla_delta_rule(shape)
        if bk is not None:
            from ..speed import fla_hopper

            fla_hopper.register_launcher()
            with fla_hopper.forced_block_width(bk):
                got, seconds = timed(grads, run, leaves, inputs["do"])
            name = f"fla chunk_gated_delta_rule, BK {bk} forced"
        else:
            got, seconds = timed(grads, run, leaves, inputs["do"])
            name = "fla chunk_gated_delta_rule"
    tensors = ("o", "dq", "dk", "dv", "dg", "dbeta")
    low = floors(floor, ref, sens, tensors)
    return [Row(shape.name, name, t, *errors(got[t], ref[t]), low[t], seconds) for t in tensors]


def check_conv(shape: Shape, device, seed: int = 0, kernel=None) -> list[Row]:
    """fla's varlen causal_conv1d (SiLU, no bias, as Qwen3.5's layer; or ``kernel``, a function (x, weight) -> y)
    against the fp32 per-conversation conv."""
    if not shape.conv:
        return []
    inputs = make_inputs(shape, device, seed)
    leaves = {"x": inputs["x"], "weight": inputs["weight"]}
    def ref_fn(**x):
        return conv_reference(**x, lengths=shape.lengths, padded=shape.padded)

    ref = grads(ref_fn, leaves, inputs["dy"].float())
    sens = grads(ref_fn, {n: perturbed(x, 100 + i) for i, (n, x) in enumerate(leaves.items())}, perturbed(inputs["dy"], 99))
    low = floors(grads(torch_conv(shape), leaves, inputs["dy"]), ref, sens, ("o", "dx", "dweight"))
    got, seconds = timed(grads, kernel or fla_conv(shape), leaves, inputs["dy"])
    name = getattr(kernel, "__name__", "kernel") if kernel else "fla causal_conv1d"
    return [Row(shape.name, name, t, *errors(got[t], ref[t]), low[t], seconds) for t in ("o", "dx", "dweight")]


def table(rows: list[Row]) -> str:
    lines = [f"| shape | kernel | tensor | max abs | relative | bf16 floor | bound ({BOUND_FACTOR:g}x) | within |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.shape} | {r.kernel} | {r.tensor} | {r.max_abs:.3g} | {r.rel:.3g} | {r.floor:.3g} | "
                     f"{r.bound:.3g} | {'yes' if r.ok else '**NO**'} |")
    return "\n".join(lines) + "\n"
