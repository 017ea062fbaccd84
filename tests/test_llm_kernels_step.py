"""The rest of the hybrid's step on the CPU: speed.fla_gated_norm (Qwen3.5's gated RMSNorm through fla's fused
kernel, here its arithmetic in torch) equals transformers' module forward and backward and, with speed.liger,
every norm of a tiny Qwen3.5 is a fused one; speed.compile around the fla calls breaks a Gated DeltaNet layer's
graph only where fla runs, and the compiled packed step (Dynamo + AOTAutograd, aot_eager) equals the eager one
for Qwen3 and Qwen3.5. (The Triton kernels and Inductor: tests/gpu/test_llm_step_cuda.py.)"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from brisk.data.collate import Collator
from brisk.errors import ConfigError
from brisk.models.build import build_model
from brisk.speed import llm_kernels as K

from .test_chat_model import QWEN3, QWEN3_5, chat_cfg, fake_fla, fake_liger, loss_and_grads, samples  # noqa: F401


def fake_fla_norm(monkeypatch):
    """fla's rms_norm_gated as brisk calls it, with the kernel's arithmetic in torch (fp32 inside, one rounding)."""

    def rms_norm_gated(x, g, weight, bias, activation="swish", eps=1e-6, **kw):
        assert activation == "swish" and bias is None
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        return (y * F.silu(g.float())).to(x.dtype)

    for name in ("fla", "fla.modules", "fla.modules.norm"):
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    mod = types.ModuleType("fla.modules.norm.fused_norm_gate")
    mod.rms_norm_gated = rms_norm_gated
    monkeypatch.setitem(sys.modules, "fla.modules.norm.fused_norm_gate", mod)


def _spread_norm_weights(*models):
    """Norm weights off their init (zeros for 1 + weight, ones for the gated norm): a wrong offset shows."""
    with torch.no_grad():
        for m in models:
            for n, p in m.named_parameters():
                if "norm" in n and n.endswith("weight"):
                    p.copy_(torch.linspace(-0.5, 0.5, p.numel()) + (1.0 if ".linear_attn.norm." in n else 0.0))


def test_gated_norm_equals_transformers_forward_and_backward(monkeypatch):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    fake_fla_norm(monkeypatch)
    torch.manual_seed(0)
    ref = Qwen3_5RMSNormGated(32, eps=1e-6)
    with torch.no_grad():
        ref.weight.copy_(torch.linspace(0.5, 1.5, 32))
    fast = K.swap_class(ref, K.FlaGatedNorm)
    assert fast.weight is ref.weight and isinstance(fast, Qwen3_5RMSNormGated)
    x, gate = torch.randn(40, 32, requires_grad=True), torch.randn(40, 32, requires_grad=True)
    outs = []
    for m in (ref, fast):
        y = m(x, gate)
        (grads := torch.autograd.grad((y * torch.linspace(-1, 1, 32)).sum(), (x, gate, m.weight)))
        outs.append((y.detach(), grads))
    (y0, g0), (y1, g1) = outs
    assert torch.allclose(y0, y1, rtol=1e-6, atol=1e-6)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_norm_swaps_cover_every_norm_of_qwen3_5_and_keep_the_numbers(samples, monkeypatch):  # noqa: F811
    fake_liger(monkeypatch)
    fake_fla_norm(monkeypatch)
    cfg = chat_cfg(QWEN3_5)
    ref, fast = build_model(cfg), build_model(cfg)
    _spread_norm_weights(ref, fast)
    keys = list(fast.state_dict())
    assert K.apply_fla_gated_norm(fast).startswith("fla_gated_norm: 2 gated RMSNorms")  # one a Gated DeltaNet layer
    K.apply_liger_kernels(fast)
    assert list(fast.state_dict()) == keys
    norms = [(n, m) for n, m in fast.named_modules() if "RMSNorm" in type(m).__name__]
    assert len(norms) == 2 * 4 + 1 + 2 * 2 + 2  # 2 a layer, the final one, q/k of 2 attention layers, 2 gated
    assert all(isinstance(m, (K.LigerNorm, K.FlaGatedNorm)) for _, m in norms), \
        [n for n, m in norms if not isinstance(m, (K.LigerNorm, K.FlaGatedNorm))]
    batch = Collator()(samples)
    l0, g0, _ = loss_and_grads(ref, batch)
    l1, g1, _ = loss_and_grads(fast, batch)
    assert torch.allclose(l0, l1, rtol=1e-6) and g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-4, atol=1e-6), n


# The CUDA plan is asked for in bf16: with fla importable (faked here) it refuses an fp32 Qwen3.5 (brisk.plan,
# round 9), while these CPU tests run the model in fp32.
PLAN_BF16 = "model.llm.dtype=bf16"


def test_gated_norm_switch_on_and_off(tmp_path, monkeypatch):
    from brisk.plan import make_plan
    from brisk.speed import accelerate

    fake_fla_norm(monkeypatch)
    for on in (False, True):
        over = QWEN3_5 + [f"speed.fla_gated_norm={str(on).lower()}"]
        model = build_model(chat_cfg(over))
        out = accelerate(model, make_plan(chat_cfg([*over, PLAN_BF16]), "cuda")[1])
        swapped = [m for m in model.modules() if isinstance(m, K.FlaGatedNorm)]
        assert len(swapped) == (2 if on else 0)
        assert any(n.startswith("fla_gated_norm: 2") for n in out.notes) == on
    cfg = chat_cfg(QWEN3 + ["speed.fla_gated_norm=true"])  # a dense model has none: said, nothing swapped
    assert "no gated RMSNorm" in K.apply_fla_gated_norm(build_model(cfg))


def test_gated_norm_needs_cuda_and_fla(monkeypatch):
    from brisk.plan import make_plan

    cfg = chat_cfg(QWEN3_5 + ["speed.fla_gated_norm=true"])
    with pytest.raises(ConfigError, match="speed.fla_gated_norm"):
        make_plan(cfg, "cpu")
    monkeypatch.setitem(sys.modules, "fla", None)  # not importable
    monkeypatch.setattr(K, "available", lambda package: False)
    with pytest.raises(ConfigError, match="fla-core"):
        K.apply_fla_gated_norm(build_model(cfg))


# ------------------------------------------------------------------------------------------ compile
def _layer_call(model, batch, index):
    """The positional and keyword arguments decoder layer ``index`` gets in a forward of ``batch``."""
    seen = {}
    layer = model.llm.model.layers[index]
    handle = layer.register_forward_pre_hook(lambda m, a, kw: seen.update(args=a, kwargs=kw), with_kwargs=True)
    with torch.no_grad():
        model(batch)
    handle.remove()
    return layer, seen["args"], seen["kwargs"]


def test_fla_layer_breaks_its_graph_only_at_the_fla_call(samples, monkeypatch):  # noqa: F811
    """torch._dynamo.explain of a compiled Gated DeltaNet decoder layer (fla swapped in, packed row): the graph
    breaks only where fla's conv and delta rule run (torch.compiler.disable). Dynamo (2.11-2.13) has no nested
    graph breaks: the break inside the mixer's forward splits the layer's frame at the mixer call too, so the
    layer is 4 graphs at most (before / after the mixer, the mixer before / after fla), 3 breaks, one reason."""
    fake_fla(monkeypatch)
    model = build_model(chat_cfg(QWEN3_5))
    K.apply_fla_linear_attention(model)
    packed = Collator(packed=True, token_buckets=(512,))(samples)
    layer, args, kwargs = _layer_call(model, packed, 0)  # layer 0 is a linear-attention layer
    assert isinstance(layer.linear_attn, K.FlaVarlen)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(layer)(*args, **kwargs)
    reasons = [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count <= 4 and explained.graph_break_count <= 3, reasons
    assert reasons and all("_fla_mix" in r for r in reasons), reasons
    full, args, kwargs = _layer_call(model, packed, 1)  # the full-attention layer: one graph, no break
    torch._dynamo.reset()
    explained = torch._dynamo.explain(full)(*args, **kwargs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_compiled_packed_step_equals_eager(arch, samples, tmp_path, monkeypatch):  # noqa: F811
    """speed.compile's layers (apply_compile, traced by Dynamo + AOTAutograd with the aot_eager backend on the
    CPU) give the eager loss and gradients on a packed row; Qwen3.5 with fla (its torch stand-in) swapped in."""
    from brisk.plan import make_plan
    from brisk.speed.compile import apply_compile, compile_counters

    over = (QWEN3 if arch == "qwen3" else QWEN3_5) + ["speed.compile=true", f"speed.inductor_cache_dir={tmp_path}"]
    cfg = chat_cfg(over)
    ref, fast = build_model(cfg), build_model(cfg)
    if arch == "qwen3_5":
        fake_fla(monkeypatch)
        K.apply_fla_linear_attention(ref)
        K.apply_fla_linear_attention(fast)
    torch._dynamo.reset()
    note = apply_compile(fast, make_plan(chat_cfg([*over, PLAN_BF16]), "cuda")[1].speed, "cuda", backend="aot_eager")
    layers = cfg.model.llm.config["num_hidden_layers"]
    assert note.startswith(f"compile: {layers} x decoder layer")
    packed = Collator(packed=True, token_buckets=(512,))(samples)
    before = compile_counters()["graphs"]
    for _ in range(2):  # the second step runs the graphs already compiled
        l0, g0, _ = loss_and_grads(ref, packed)
        l1, g1, _ = loss_and_grads(fast, packed)
        assert torch.allclose(l0, l1, rtol=1e-5), (l0, l1)
        assert g0.keys() == g1.keys()
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=1e-4, atol=1e-6), n
    assert compile_counters()["graphs"] > before  # Dynamo did compile the layers
