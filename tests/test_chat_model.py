"""task: chat models: Qwen3 (dense) and Qwen3.5 (Gated DeltaNet + gated full attention) from inline configs;
packed rows give the padded loss and gradients for both layer types; the hidden-state path feeds lm_head;
the HF export loads in AutoModelForCausalLM with the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from brisk.config import load_config
from brisk.data.chat_store import build_chat_store
from brisk.data.collate import Collator
from brisk.models.build import build_model
from brisk.models.lm import lm_loss
from brisk.speed.llm_kernels import apply_linear_attention_per_sequence, linear_attention_layers

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "chat_demo"
QWEN3 = ["model.llm.config.num_hidden_layers=2"]
QWEN3_5 = ["model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 64, intermediate_size: 128, "
           "num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, "
           "linear_num_key_heads: 2, linear_num_value_heads: 4, linear_key_head_dim: 16, linear_value_head_dim: 16, "
           "linear_conv_kernel_dim: 4, tie_word_embeddings: false, "
           "layer_types: [linear_attention, full_attention, linear_attention, full_attention]}"]


def chat_cfg(overrides):
    return load_config(ROOT / "configs" / "sft_demo.yaml", overrides)


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(str(DEMO / "tokenizer"), local_files_only=True)
    ds = build_chat_store(str(DEMO / "valid.jsonl"), tok, max_len=512, overlong="truncate", skip_bad=False,
                          cache_dir=tmp_path_factory.mktemp("cache"))
    return [ds[i] for i in range(6)]


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss, _, count = lm_loss(model(batch), batch.labels)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, count


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_packed_equals_padded(arch, samples):
    model = build_model(chat_cfg(QWEN3 if arch == "qwen3" else QWEN3_5))
    keys = list(model.state_dict())
    layers = linear_attention_layers(model.llm)
    assert (len(layers) == 2) == (arch == "qwen3_5")
    note = apply_linear_attention_per_sequence(model)
    assert list(model.state_dict()) == keys and ("2 Gated DeltaNet" in note) == (arch == "qwen3_5")
    padded = Collator()(samples)
    packed = Collator(packed=True, token_buckets=(512,))(samples)
    l1, g1, c1 = loss_and_grads(model, padded)
    l2, g2, c2 = loss_and_grads(model, packed)
    assert int(c1) == int(c2) > 0
    assert torch.allclose(l1, l2, rtol=1e-5, atol=1e-6), (l1, l2)
    assert g1.keys() == g2.keys() and len(g1) == len(dict(model.named_parameters()))
    for n in g1:
        assert torch.allclose(g1[n], g2[n], rtol=1e-4, atol=1e-6), n


def test_batched_linear_attention_equals_per_sequence_and_padded(samples):
    """The right-padded batch path: the same loss and gradients as each conversation on its own and as the
    padded batch, on a row whose conversations differ in length and end in a bucket's padding tail."""
    from brisk.speed.llm_kernels import PaddedBatch, apply_linear_attention_batched

    ref = build_model(chat_cfg(QWEN3_5))
    fast = build_model(chat_cfg(QWEN3_5))
    apply_linear_attention_per_sequence(ref)
    assert "2 Gated DeltaNet" in apply_linear_attention_batched(fast)
    assert list(fast.state_dict()) == list(ref.state_dict())
    assert sum(isinstance(m, PaddedBatch) for m in fast.modules()) == 2
    padded, packed = Collator()(samples), Collator(packed=True, token_buckets=(512,))(samples)
    lengths = (packed.cu_seqlens[1:] - packed.cu_seqlens[:-1]).tolist()
    assert len(set(x for x in lengths if x)) > 2 and int(packed.cu_seqlens[-1]) == packed.input_ids.shape[1]
    l0, g0, _ = loss_and_grads(ref, packed)
    for batch in (packed, padded):
        l1, g1, _ = loss_and_grads(fast, batch)
        assert torch.allclose(l0, l1, rtol=1e-5, atol=1e-6), (l0, l1)
        assert g1.keys() == g0.keys()
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=1e-4, atol=1e-6), n


def test_linear_attention_leaks_across_a_packed_row_without_the_swap(samples):
    """Why the swap exists: transformers' torch path cannot keep packed sequences apart."""
    model = build_model(chat_cfg(QWEN3_5))
    padded, packed = Collator()(samples), Collator(packed=True, token_buckets=(512,))(samples)
    ref = lm_loss(model(padded), padded.labels)[0]
    try:
        got = lm_loss(model(packed), packed.labels)[0]
    except ValueError as e:  # transformers 5.24 refuses cu_seqlens on its torch path
        assert "packed" in str(e)
    else:
        assert not torch.allclose(ref, got, rtol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_hidden_feeds_lm_head(arch, samples):
    model = build_model(chat_cfg(QWEN3 if arch == "qwen3" else QWEN3_5)).eval()
    batch = Collator()(samples)
    with torch.no_grad():
        hidden = model(batch, hidden=True)
        logits = model(batch)
    assert hidden.shape[:2] == logits.shape[:2] and hidden.shape[-1] == model.llm.config.hidden_size
    assert torch.allclose(model.llm.get_output_embeddings()(hidden), logits, atol=1e-5)


LORA = ["model.llm.lora.enabled=true", "model.llm.lora.only=true", "model.llm.lora.dropout=0.0",
        "model.llm.lora.target_modules=[q_proj,v_proj,gate_proj,in_proj_qkv,out_proj]"]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_lora_and_activation_checkpointing_in_chat_models(arch, samples):
    """model.llm.lora and model.llm.activation_checkpoint act on task: chat too: only the adapters train, the
    base weights keep their names, and recomputing every layer gives the same loss and gradients."""
    from brisk.adapters.lora import LoraLinear

    base = QWEN3 if arch == "qwen3" else QWEN3_5
    plain = build_model(chat_cfg(base))
    lora = build_model(chat_cfg(base + LORA))
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all(n.rsplit(".", 1)[1] in ("lora_A", "lora_B") for n in trainable)
    assert any(isinstance(m, LoraLinear) for m in lora.modules())
    assert set(plain.state_dict()) <= set(lora.state_dict())
    ckpt = build_model(chat_cfg(base + LORA + ["model.llm.activation_checkpoint=1"]))
    ckpt.load_state_dict(lora.state_dict())
    with torch.no_grad():  # B starts at zero: give the adapters an update to check
        for m in (lora, ckpt):
            for n, p in m.named_parameters():
                if n.endswith("lora_B"):
                    p.copy_(torch.linspace(-0.1, 0.1, p.numel()).reshape(p.shape))
    layers = ckpt.llm.base_model.layers
    assert all(type(m).__name__.startswith("Checkpointed") for m in layers) and len(layers) > 1
    batch = Collator()(samples)
    l1, g1, _ = loss_and_grads(lora, batch)
    l2, g2, _ = loss_and_grads(ckpt, batch)
    assert torch.allclose(l1, l2) and g1.keys() == g2.keys() == set(trainable)
    for n in g1:
        assert torch.allclose(g1[n], g2[n], rtol=1e-5, atol=1e-7), n


@pytest.mark.parametrize("arch,lora", [("qwen3", False), ("qwen3_5", False), ("qwen3_5", True)])
def test_hf_export_round_trip(arch, lora, samples, tmp_path):
    from brisk.models.export import export_folder

    cfg = chat_cfg((QWEN3 if arch == "qwen3" else QWEN3_5) + (LORA if lora else []))
    model = build_model(cfg).eval()
    if lora:  # a trained adapter: the export folds W + (alpha / r) B A into transformers' plain layers
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("lora_B"):
                    p.copy_(torch.linspace(-0.1, 0.1, p.numel()).reshape(p.shape))
    out = export_folder(model, cfg, tmp_path / "hf", "hf", "fp32")
    loaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tok.chat_template and type(loaded).__name__ == type(model.llm).__name__
    batch = Collator()(samples)
    with torch.no_grad():
        ours = model(batch)
        theirs = loaded(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    if lora:  # folding rounds once in fp32
        assert torch.allclose(ours, theirs, atol=1e-5) and not torch.allclose(ours, theirs * 0)
    else:
        assert torch.equal(ours, theirs)


def fake_fla(monkeypatch):
    """fla's two entry points as brisk calls them, computed per sequence with transformers' torch reference: the
    plumbing around the kernels (projections, heads, gates, norm, varlen boundaries) is then checked on the CPU;
    the Triton kernels themselves are checked in tests/gpu/test_llm_kernels_cuda.py."""
    import sys
    import types

    import torch.nn.functional as F
    from transformers.models.qwen3_5 import modeling_qwen3_5 as q35

    calls: list = []  # (entry, cu_seqlens, cu_seqlens_cpu, chunk_indices) of every call

    def segments(t, cu):
        bounds = cu.tolist() if cu is not None else [0, t]
        return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    def causal_conv1d(x, weight, bias=None, activation=None, cu_seqlens=None, **kw):
        calls.append(("conv", cu_seqlens, kw.get("cu_seqlens_cpu"), kw.get("chunk_indices")))
        out = []
        for a, b in segments(x.shape[1], cu_seqlens):
            seg = x[:, a:b].transpose(1, 2)
            y = F.conv1d(seg, weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1, groups=weight.shape[0])
            out.append(y[..., : b - a].transpose(1, 2))
        y = torch.cat(out, dim=1)
        return (F.silu(y) if activation == "silu" else y), None

    def chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kw):
        calls.append(("delta", cu_seqlens, kw.get("cu_seqlens_cpu"), kw.get("chunk_indices")))
        reference = getattr(q35.torch_chunk_gated_delta_rule, "__wrapped__", q35.torch_chunk_gated_delta_rule)
        out = [reference(q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)[0] for a, b in segments(q.shape[1], cu_seqlens)]
        return torch.cat(out, dim=1), None

    mods = {"fla": types.ModuleType("fla"), "fla.modules": types.ModuleType("fla.modules"),
            "fla.modules.causal_conv1d": types.ModuleType("fla.modules.causal_conv1d"),
            "fla.modules.causal_conv1d.ops": types.ModuleType("fla.modules.causal_conv1d.ops"),
            "fla.ops": types.ModuleType("fla.ops"), "fla.ops.gated_delta_rule": types.ModuleType("fla.ops.gated_delta_rule")}
    mods["fla.modules.causal_conv1d.ops"].causal_conv1d = causal_conv1d
    mods["fla.ops.gated_delta_rule"].chunk_gated_delta_rule = chunk_gated_delta_rule
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def test_fla_swap_computes_the_layer_on_packed_and_padded_rows(samples, monkeypatch):
    from brisk.speed.llm_kernels import apply_fla_linear_attention

    fake_fla(monkeypatch)
    ref = build_model(chat_cfg(QWEN3_5))
    fast = build_model(chat_cfg(QWEN3_5))
    apply_linear_attention_per_sequence(ref)
    assert "2 Gated DeltaNet" in apply_fla_linear_attention(fast)
    assert list(fast.state_dict()) == list(ref.state_dict())
    padded, packed = Collator()(samples), Collator(packed=True, token_buckets=(512,))(samples)
    l0, g0, _ = loss_and_grads(ref, padded)
    for batch in (padded, packed):
        l1, g1, _ = loss_and_grads(fast, batch)
        assert torch.allclose(l0, l1, rtol=1e-5, atol=1e-6), (l0, l1)
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=1e-4, atol=1e-6), n


def fake_liger(monkeypatch):
    """liger's RMSNorm and SiLU-mul as brisk calls them, in plain torch (the kernels: tests/gpu)."""
    import sys
    import types

    import torch.nn.functional as F

    class RMSNorm:
        @staticmethod
        def apply(x, w, eps, offset, casting_mode, in_place):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return (y * (offset + w.float())).to(x.dtype)

    class SiLUMul:
        @staticmethod
        def apply(a, b):
            return F.silu(a) * b

    mods = {"liger_kernel": types.ModuleType("liger_kernel"), "liger_kernel.ops": types.ModuleType("liger_kernel.ops"),
            "liger_kernel.ops.rms_norm": types.ModuleType("liger_kernel.ops.rms_norm"),
            "liger_kernel.ops.swiglu": types.ModuleType("liger_kernel.ops.swiglu")}
    mods["liger_kernel.ops.rms_norm"].LigerRMSNormFunction = RMSNorm
    mods["liger_kernel.ops.swiglu"].LigerSiLUMulFunction = SiLUMul
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_liger_swaps_find_every_norm_and_mlp_and_keep_the_numbers(arch, samples, monkeypatch):
    from brisk.speed.llm_kernels import apply_liger_kernels

    fake_liger(monkeypatch)
    over = QWEN3 if arch == "qwen3" else QWEN3_5
    ref, fast = build_model(chat_cfg(over)), build_model(chat_cfg(over))
    with torch.no_grad():  # Qwen3.5 norms start at 0 (weight + 1): move them off it, so a wrong offset shows
        for m in (ref, fast):
            for n, p in m.named_parameters():
                if n.endswith("norm.weight"):
                    p.copy_(torch.linspace(-0.5, 0.5, p.numel()))
    note = apply_liger_kernels(fast)
    layers = 2 if arch == "qwen3" else 4
    qk_norms = 2 * (2 if arch == "qwen3" else 2)  # q_norm and k_norm of each full-attention layer
    assert note.startswith(f"liger: {2 * layers + 1 + qk_norms} RMSNorms and {layers} SwiGLU MLPs"), note
    assert list(fast.state_dict()) == list(ref.state_dict())
    batch = Collator()(samples)
    l0, g0, _ = loss_and_grads(ref, batch)
    l1, g1, _ = loss_and_grads(fast, batch)
    assert torch.allclose(l0, l1, rtol=1e-6) and all(torch.allclose(g0[n], g1[n], atol=1e-6) for n in g0)


def test_fla_gets_one_cu_seqlens_a_step_and_its_host_copy(samples, monkeypatch):
    """Every Gated DeltaNet layer of a step hands fla the same int64 cu_seqlens object and its host copy (fla
    memoises its chunk indices by identity and reads host counts without a sync); the next batch gets new ones."""
    from brisk.speed.llm_kernels import apply_fla_linear_attention

    calls = fake_fla(monkeypatch)
    fast = build_model(chat_cfg(QWEN3_5))
    apply_fla_linear_attention(fast)
    packed = Collator(packed=True, token_buckets=(512,))(samples)
    loss_and_grads(fast, packed)
    assert len(calls) == 4  # 2 Gated DeltaNet layers x (conv, delta rule)
    cu, host = calls[0][1], calls[0][2]
    assert all(c[1] is cu and c[2] is host for c in calls)
    assert cu.dtype == torch.int64 and host.device.type == "cpu" and torch.equal(host, cu.cpu())
    assert torch.equal(cu, packed.cu_seqlens.long())
    again = Collator(packed=True, token_buckets=(512,))(samples[:3])
    loss_and_grads(fast, again)
    assert calls[-1][1] is not cu and torch.equal(calls[-1][2], again.cu_seqlens.long())
    calls.clear()
    loss_and_grads(fast, Collator()(samples))  # padded rows: no cu_seqlens
    assert all(c[1] is None and c[2] is None for c in calls)
