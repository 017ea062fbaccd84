"""`brisk doctor --kernels CONFIG`: every kernel the config's speed plan would use on this machine, run at the
config's shapes, checked against its reference and timed against the path it replaces; and where transformers
or the plan would take a slow or a wrong path instead.

Each check is seconds of work at one layer's shape (fp32 references; bf16 kernels), with the bound the
Gated DeltaNet kernel check declares (gdn_check: 16 times the bf16 floor). Triton kernels are compiled on first
use, which on a cold cache takes the longest. On a machine without CUDA it checks what runs there (the torch
Gated DeltaNet fallback, the block-causal attention) and names what it cannot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config.llm import linear_key_head_dims, llm_config_tree
from ..plan import make_plan
from ..speed.fla_hopper import in_window, triton_version
from ..speed.llm_kernels import available, fla_refusal
from ..speed.varlen import block_causal_mask, varlen_attention
from . import gdn_check as G


@dataclass
class Check:
    kernel: str
    shape: str
    worst: str  # the tensor furthest from its reference, relative to its bound
    ratio: float  # its relative error over its bound (<= 1: within)
    kernel_ms: float | None = None
    fallback_ms: float | None = None
    fallback: str = ""

    def line(self) -> str:
        speed = (f"{self.kernel_ms:.2f} ms vs {self.fallback_ms:.2f} ms ({self.fallback}): "
                 f"{self.fallback_ms / self.kernel_ms:.1f}x" if self.kernel_ms and self.fallback_ms else "-")
        verdict = "within" if self.ratio <= 1 else "**OUTSIDE**"
        return f"| {self.kernel} | {self.shape} | {self.worst} at {self.ratio:.2f} of its bound | {verdict} | {speed} |"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _ms(fn, reps: int = 3) -> float:
    fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync()
    return 1000 * (time.perf_counter() - t0) / reps


def _check(name: str, shape: str, kernel, reference, leaves: dict, upstream: torch.Tensor) -> Check:
    """kernel against reference (fp32) on the same leaves; each tensor's bound is 16 times the larger of one
    bf16 rounding of the reference and the reference's own move under unit-roundoff perturbations of its
    inputs (gdn_check's floor, without a torch path of its own)."""
    got = G.grads(kernel, leaves, upstream)
    ref = G.grads(reference, leaves, upstream.float())
    moved = G.grads(reference, {n: G.perturbed(x, 100 + i) for i, (n, x) in enumerate(leaves.items())},
                     G.perturbed(upstream, 99))
    worst, ratio = "", -1.0
    for t in ref:
        floor = max(G.errors(ref[t].bfloat16(), ref[t])[1], G.errors(moved[t], ref[t])[1])
        r = G.errors(got[t], ref[t])[1] / (G.BOUND_FACTOR * max(floor, 1e-6))
        if r > ratio:
            worst, ratio = t, r
    return Check(name, shape, worst, ratio)


# ---------------------------------------------------------------------------------------- the checks
def check_gated_delta_rule(tree: dict, lengths, device: str) -> list[Check]:
    heads = int(tree.get("linear_num_value_heads", 16))
    kd, vd = int(tree.get("linear_key_head_dim", 128)), int(tree.get("linear_value_head_dim", 128))
    conv = int(tree.get("linear_conv_kernel_dim", 4))
    if device == "cpu":  # the torch fallback's maths per head is the same at any head count: two heads, short row
        heads, lengths = 2, (1, 17, 64, 100)
    shape = G.Shape("config", heads, kd, kd if kd == vd else vd, tuple(lengths), conv=conv)
    desc = f"{len(lengths)} conversations, {sum(lengths)} tokens, {heads} heads, K {kd}, V {vd}"
    inputs = G.make_inputs(shape, device)
    leaves = {n: inputs[n] for n in ("q", "k", "v", "g", "beta")}
    ref = (G.reference_grads(shape, inputs), G.reference_grads(shape, inputs, perturb=True))

    def torch_path():
        return G.grads(lambda **x: G.torch_chunk_varlen(**x, lengths=shape.lengths), leaves, inputs["do"])

    out = []
    if device == "cpu":
        rows = G.check_delta_rule(shape, device, kernel="torch_chunk", ref=ref)
        c = _worst("Gated DeltaNet: transformers' torch chunk (the fallback)", desc, rows)
        c.kernel_ms, c.fallback = _ms(torch_path, 1), ""
        return [c]
    rows = G.check_delta_rule(shape, device, ref=ref)
    c = _worst("Gated DeltaNet: fla chunk_gated_delta_rule", desc, rows)
    fla = G.fla_delta_rule(shape)
    c.kernel_ms = _ms(lambda: G.grads(fla, leaves, inputs["do"]))
    c.fallback_ms, c.fallback = _ms(torch_path, 1), "transformers' torch chunk, batched"
    out.append(c)
    if G.flashqla_refusal() is None and kd == vd == 128:  # FlashQLA's kernels are for K = V = 128
        qla = G.flashqla_delta_rule(shape)
        q = _worst("Gated DeltaNet: FlashQLA chunk_gated_delta_rule", desc,
                   G.check_delta_rule(shape, device, kernel=qla, ref=ref))
        q.kernel_ms = _ms(lambda: G.grads(qla, leaves, inputs["do"]))
        q.fallback_ms, q.fallback = c.kernel_ms, "fla's chunk kernel, forward and backward"
        out.append(q)
    conv_rows = G.check_conv(shape, device)
    c = _worst("Gated DeltaNet: fla causal_conv1d (varlen)", f"{sum(lengths)} tokens, "
               f"{2 * heads * kd + heads * vd} channels", conv_rows)
    x = {"x": inputs["x"], "weight": inputs["weight"]}
    c.kernel_ms = _ms(lambda: G.grads(G.fla_conv(shape), x, inputs["dy"]))
    c.fallback_ms, c.fallback = _ms(lambda: G.grads(G.torch_conv(shape), x, inputs["dy"])), "torch conv per conversation"
    out.append(c)
    return out


def check_fla_gated_norm(tree: dict, tokens: int) -> Check:
    """fla's fused gated RMSNorm (speed.fla_gated_norm), norm(x) * weight * silu(gate), at the config's value
    heads, against its fp32 computation; the path it replaces is transformers' module in bf16, eager."""
    from ..speed.llm_kernels import _rms_norm_gated

    heads, vd = int(tree.get("linear_num_value_heads", 16)), int(tree.get("linear_value_head_dim", 128))
    eps = float(tree.get("rms_norm_eps", 1e-6))
    gen = torch.Generator().manual_seed(1)
    leaves = {n: (torch.randn(*s, generator=gen) * k + b).bfloat16().cuda()
              for n, s, k, b in (("x", (tokens * heads, vd), 1.0, 0.0), ("gate", (tokens * heads, vd), 1.0, 0.0),
                                 ("w", (vd,), 0.1, 1.0))}
    dy = torch.randn(tokens * heads, vd, generator=gen).bfloat16().cuda()
    fused = _rms_norm_gated()

    def ref(x, gate, w):
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float() * F.silu(gate.float())

    def kernel(x, gate, w):
        return fused(x, gate, w, None, activation="swish", eps=eps)

    def transformers_bf16(x, gate, w):  # Qwen3_5RMSNormGated's own order of roundings
        xf = x.float()
        y = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return (y * F.silu(gate.float())).to(x.dtype)

    c = _check("Gated DeltaNet: fla fused gated RMSNorm", f"{tokens * heads} x {vd}", kernel, ref, leaves, dy)
    c.kernel_ms = _ms(lambda: G.grads(kernel, leaves, dy))
    c.fallback_ms, c.fallback = _ms(lambda: G.grads(transformers_bf16, leaves, dy)), "transformers' module, eager"
    return c


def _worst(name: str, shape: str, rows: list[G.Row]) -> Check:
    r = max(rows, key=lambda r: r.rel / r.bound)
    return Check(name, shape, r.tensor, r.rel / r.bound)


def check_liger(tree: dict, tokens: int) -> list[Check]:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

    hidden, inter = int(tree.get("hidden_size", 1024)), int(tree.get("intermediate_size", 3072))
    vocab = int(tree.get("vocab_size", 151936))
    plus_one = str(tree.get("model_type", "")).startswith(("qwen3_5", "qwen3_next"))
    gen = torch.Generator().manual_seed(0)

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=gen) * scale).bfloat16().cuda()

    out = []
    x, w, dy = rnd(tokens, hidden), rnd(hidden, scale=0.1), rnd(tokens, hidden)
    offset, casting = (1.0, "gemma") if plus_one else (0.0, "llama")

    def norm_ref(x, w):
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + w.float())

    def norm_liger(x, w):
        return LigerRMSNormFunction.apply(x, w, 1e-6, offset, casting, False)

    leaves = {"x": x, "w": w}
    c = _check("liger RMSNorm" + (" (1 + weight)" if plus_one else ""), f"{tokens} x {hidden}", norm_liger, norm_ref,
               leaves, dy)
    c.kernel_ms = _ms(lambda: G.grads(norm_liger, leaves, dy))
    c.fallback_ms, c.fallback = _ms(lambda: G.grads(lambda x, w: norm_ref(x, w).bfloat16(), leaves, dy)), "torch, eager"
    out.append(c)
    a, b, dz = rnd(tokens, inter), rnd(tokens, inter), rnd(tokens, inter)
    leaves = {"a": a, "b": b}
    c = _check("liger SwiGLU", f"{tokens} x {inter}", lambda a, b: LigerSiLUMulFunction.apply(a, b),
               lambda a, b: F.silu(a.float()) * b.float(), leaves, dz)
    c.kernel_ms = _ms(lambda: G.grads(lambda a, b: LigerSiLUMulFunction.apply(a, b), leaves, dz))
    c.fallback_ms, c.fallback = _ms(lambda: G.grads(lambda a, b: F.silu(a) * b, leaves, dz)), "torch, eager"
    out.append(c)
    n = min(tokens, 1024)
    h, head = rnd(n, hidden), rnd(vocab, hidden, scale=hidden ** -0.5)
    target = torch.randint(0, vocab, (n,), generator=gen).cuda()
    fused = LigerFusedLinearCrossEntropyLoss(ignore_index=-100, reduction="mean")
    leaves = {"h": h, "head": head}
    one = torch.ones((), device="cuda")

    def ce_ref(h, head):
        return F.cross_entropy(h.float() @ head.float().t(), target)

    def ce_torch(h, head):
        return F.cross_entropy((h @ head.t()).float(), target)

    c = _check("liger fused linear cross-entropy", f"{n} tokens, vocab {vocab}", lambda h, head: fused(head, h, target),
               ce_ref, leaves, one)
    c.kernel_ms = _ms(lambda: G.grads(lambda h, head: fused(head, h, target), leaves, one))
    c.fallback_ms, c.fallback = _ms(lambda: G.grads(ce_torch, leaves, one)), "LM head + cross-entropy, full logits"
    out.append(c)
    return out


def check_varlen_attention(tree: dict, lengths, device: str) -> Check:
    heads, kv = int(tree.get("num_attention_heads", 16)), int(tree.get("num_key_value_heads", 8))
    d = int(tree.get("head_dim") or int(tree.get("hidden_size", 1024)) // heads)
    if device == "cpu":
        heads, kv, lengths = min(heads, 4), min(kv, 2), (1, 17, 64, 100)
    t = sum(lengths)
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the CPU runs the model's attention in fp32
    q, k, v = (torch.randn(1, h, t, d, generator=gen).to(device, dtype) for h in (heads, kv, kv))
    do = torch.randn(1, t, heads, d, generator=gen).to(device, dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)

    def kernel(q, k, v):
        return varlen_attention(None, q, k, v, None, scaling=d ** -0.5, cu_seq_lens_q=cu)[0]

    def ref(q, k, v):
        mask = block_causal_mask(cu, t)
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=d ** -0.5,
                                              enable_gqa=kv != heads).transpose(1, 2)

    leaves = {"q": q, "k": k, "v": v}
    name = "varlen attention (FlashAttention-2 varlen)" if device == "cuda" else "varlen attention (CPU: block-causal SDPA)"
    c = _check(name, f"{len(lengths)} conversations, {t} tokens, {heads}/{kv} heads, head_dim {d}", kernel, ref, leaves, do)
    c.kernel_ms = _ms(lambda: G.grads(kernel, leaves, do))
    if device == "cuda":
        def masked(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=block_causal_mask(cu, t), scale=d ** -0.5,
                                                  enable_gqa=kv != heads).transpose(1, 2)
        c.fallback_ms, c.fallback = _ms(lambda: G.grads(masked, leaves, do)), "SDPA with a [T, T] block mask"
    return c


def decoder_layer(tree: dict, device: str, dtype: torch.dtype):
    """(one full-attention decoder layer of the config's LLM, its rotary embedding) on ``device``, initialised by
    the model's own ``_init_weights`` (seeded), attention through brisk_varlen as speed.packing runs it.
    Built alone: the 248k-row embedding of a Qwen3.5 need not exist for one layer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..speed.varlen import NAME, register

    register()
    keys = {k: v for k, v in tree.items() if k not in ("architectures", "auto_map", "torch_dtype", "dtype")}
    c = AutoConfig.for_model(**keys)
    c.num_hidden_layers = 1
    if getattr(c, "layer_types", None):
        c.layer_types = ["full_attention"]
    c._attn_implementation = NAME
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(c)
    layer = shell.model.layers[0].to_empty(device="cpu")
    with torch.random.fork_rng(devices=[]):  # the model's own initialisation, seeded, the caller's RNG untouched
        torch.manual_seed(0)
        layer.apply(shell._init_weights)
    rotary = type(shell.model.rotary_emb)(config=c).to(device)  # outside the meta context: real inv_freq
    return layer.to(device, dtype), rotary


def check_compiled_layer(tree: dict, lengths, device: str, backend: str = "inductor") -> Check:
    """A decoder layer compiled as speed.compile compiles each one (Dynamo with dynamic shapes, ``backend``) on a
    packed row of the config's conversations, against the same layer in fp32 eager: output and input gradient.
    Timed against the eager layer in the run's dtype; the first call's compile time is in the shape column."""
    import copy

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    layer, rotary = decoder_layer(tree, device, dtype)
    reference = copy.deepcopy(layer).float()
    compiled = copy.deepcopy(layer)
    compiled.compile(dynamic=True, backend=backend)
    t = sum(lengths)
    hidden = int(tree.get("hidden_size", 1024))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, t, hidden, generator=gen).to(device, dtype)
    do = torch.randn(1, t, hidden, generator=gen).to(device, dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    pos = torch.cat([torch.arange(n) for n in lengths]).to(device)[None]
    packed = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lengths), "max_length_k": max(lengths)}

    def run(module):
        def fn(x):
            out = module(x, attention_mask=None, position_ids=pos, position_embeddings=rotary(x, pos), **packed)
            return out[0] if isinstance(out, tuple) else out
        return fn

    t0 = time.perf_counter()
    G.grads(run(compiled), {"x": x}, do)  # the first call compiles
    _sync()
    compile_s = time.perf_counter() - t0
    shape = (f"one decoder layer, {len(lengths)} conversations, {t} tokens, hidden {hidden}; "
             f"compiled in {compile_s:.1f} s ({backend}, dynamic shapes)")
    c = _check("compiled decoder layer (speed.compile)", shape, run(compiled), run(reference), {"x": x}, do)
    c.kernel_ms = _ms(lambda: G.grads(run(compiled), {"x": x}, do))
    c.fallback_ms, c.fallback = _ms(lambda: G.grads(run(layer), {"x": x}, do)), "the same layer, eager"
    return c


# -------------------------------------------------------------------------------------- what falls back
def fallbacks(tree: dict, plan, device: str) -> list[str]:
    """Where transformers or the plan takes a slow or a wrong path, in plain words."""
    lines = []
    linear = "linear_attention" in (tree.get("layer_types") or []) or "linear_key_head_dim" in tree
    window = device == "cuda" and in_window(torch.cuda.get_device_capability(), triton_version())
    if linear:
        fla = available("fla")
        if not fla:
            lines.append("Gated DeltaNet: flash-linear-attention is not installed, so transformers runs its torch chunk "
                         "loop (correct, launch-bound, many times slower; `pip install fla-core`)"
                         + ("; the plan runs it batched (speed.linear_attention_batched)"
                            if "linear_attention_batched" in plan else ""))
        elif "fla_kernels" not in plan:
            lines.append("Gated DeltaNet: fla is importable, so transformers binds fla's chunk_gated_delta_rule for "
                         "every Qwen3.5 layer in the process, also with speed.fla_kernels off"
                         + ("; on this GPU with this Triton fla refuses its gated backward (RuntimeError at the first "
                            "backward) unless speed.fla_kernels=true, which runs it at brisk's checked block widths"
                            if window else ""))
        else:
            lines.append("Gated DeltaNet: speed.fla_kernels runs fla's varlen conv and chunked delta rule"
                         + (" (its gated backward through brisk's launcher: fla alone refuses it with this Triton on "
                            "Hopper)" if window else ""))
        why = fla_refusal([int(tree.get("linear_key_head_dim", 128))]) if fla else None
        if why:
            lines.append(why)
        if fla and "fla_gated_norm" not in plan and "compile" not in plan:
            lines.append("Gated DeltaNet's gated RMSNorm runs eager torch, ~10 kernels forward and ~20 backward a layer "
                         "(speed.fla_gated_norm fuses it; speed.compile lets Inductor fuse it)")
        if not available("causal_conv1d"):
            lines.append("short conv: the causal-conv1d CUDA package is not installed; transformers' torch conv ignores "
                         "packed boundaries (3 tokens leak into the next conversation on its own padding-free path); "
                         "brisk's Gated DeltaNet swaps keep conversations apart")
    if device == "cuda" and not ({"liger", "liger_loss"} & set(plan.on)):
        lines.append("RMSNorm, SwiGLU and the loss run eager torch (speed.liger / speed.liger_loss / speed.label_head "
                     "are off)" if "label_head" not in plan else "RMSNorm and SwiGLU run eager torch (speed.liger off)")
    if "packing" not in plan:
        lines.append("attention: padded batches (speed.packing off): the padded-mask SDPA call, which on Hopper can "
                     "take cuDNN's per-shape plan builds (see `brisk doctor`)")
    if "compile" in plan and device != "cuda":
        lines.append("compile: the plan compiles nothing on the CPU (speed.compile is for CUDA devices)")
    return lines


def kernel_doctor(config: str, overrides: list[str] | None = None) -> str:
    from ..config import load_config

    cfg = load_config(config, list(overrides or []))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from ..families import family_of

    lm_kernels = "fla_kernels" in family_of(cfg).switches  # a family whose decoder these kernels serve
    why = fla_refusal(linear_key_head_dims(cfg.model.llm)) if lm_kernels and available("fla") else None
    cfg, plan = make_plan(cfg, device, 1, {"fla_kernels": why} if why and device == "cuda" else {})  # as assemble does
    tree = llm_config_tree(cfg.model.llm)
    budget = min(int(cfg.data.batch_tokens), 8192)
    lengths, total = [], 0
    for n in G.MIXED:  # rows up to 2,048 tokens (the default causal_lm.max_len), whatever the run's cap
        if total + n > budget:
            break
        lengths.append(n)
        total += n
    lines = [f"# brisk doctor --kernels {config}", "",
             f"- device: {torch.cuda.get_device_name() if device == 'cuda' else 'CPU (no CUDA)'}; torch {torch.__version__}"
             + (f", Triton {'.'.join(map(str, triton_version()))}" if triton_version() else ""),
             f"- the plan here: {', '.join(plan.on) or 'no switch'}" + "".join(f"; {n}" for n in plan.notes), "",
             "| kernel | shape | worst error | vs the bf16 bound | speed vs the path it replaces |", "|---|---|---|---|---|"]
    cannot = []
    linear = "linear_attention" in (tree.get("layer_types") or []) or "linear_key_head_dim" in tree
    if not lm_kernels:
        cannot.append(f"this check covers the causal LM family's kernels (model.family={cfg.model.family} takes none "
                      "of them); the speech path's are checked by `brisk probe compare` against the eager reference")
    else:
        if linear:
            refusal = fla_refusal([int(tree.get("linear_key_head_dim", 128))]) if available("fla") else \
                "flash-linear-attention is not installed"
            if device == "cuda" and not refusal:
                from ..speed.fla_hopper import register_launcher

                register_launcher()  # as speed.fla_kernels does
                lines += [c.line() for c in check_gated_delta_rule(tree, lengths, device)]
                lines.append(check_fla_gated_norm(tree, min(budget, 4096)).line())
            elif device == "cpu":
                lines += [c.line() for c in check_gated_delta_rule(tree, lengths, device)]
                cannot.append("fla's kernels: Triton kernels need CUDA (checked above: the torch fallback the plan runs)")
            else:
                cannot.append(f"fla's kernels: {refusal}")
            qla = G.flashqla_refusal() if device == "cuda" else "TileLang kernels need CUDA"
            if qla:
                cannot.append(f"FlashQLA: {qla}")
        if device == "cuda" and available("liger_kernel"):
            lines += [c.line() for c in check_liger(tree, min(budget, 4096))]
        else:
            cannot.append("liger-kernel: " + ("Triton kernels need CUDA" if device == "cpu" else "not installed"))
        lines.append(check_varlen_attention(tree, lengths, device).line())
        if "compile" in plan.on and device == "cuda":
            lines.append(check_compiled_layer(tree, lengths, device).line())
        if device == "cpu":
            cannot.append("FlashAttention-2 varlen: CUDA only (checked above: the CPU's block-causal SDPA path)")
    lines += ["", "## Where a slow or wrong path is taken", ""] + [f"- {x}" for x in fallbacks(tree, plan, device)]
    if cannot:
        lines += ["", "## Not checked here", ""] + [f"- {x}" for x in cannot]
    return "\n".join(lines) + "\n"
