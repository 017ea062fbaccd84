"""LLM kernels on CUDA (skipped without CUDA or without the package): flash-linear-attention's varlen Triton
kernels keep packed sequences apart (packed == padded == the per-sequence reference, loss and gradients, for
Qwen3.5's Gated DeltaNet layers), and liger-kernel's RMSNorm / SwiGLU / fused linear cross-entropy give the
plain loss and gradients.

    python -m pytest tests/gpu/test_llm_kernels_cuda.py -q        # on the GPU machine, with fla-core + liger-kernel
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from brisk.config import load_config
from brisk.data.chat_store import build_chat_store
from brisk.data.collate import Collator
from brisk.models.build import build_model
from brisk.models.lm import lm_loss
from brisk.speed import llm_kernels as K

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
QWEN3_5 = ["model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 256, intermediate_size: 512, "
           "num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, "
           "linear_num_key_heads: 2, linear_num_value_heads: 4, linear_key_head_dim: 128, linear_value_head_dim: 64, "
           "linear_conv_kernel_dim: 4, tie_word_embeddings: false, "
           "layer_types: [linear_attention, full_attention, linear_attention, full_attention]}"]


def model(overrides, dtype="fp32"):
    cfg = load_config(ROOT / "configs" / "sft_demo.yaml", [*overrides, f"model.llm.dtype={dtype}"])
    return build_model(cfg, "cuda")


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(str(ROOT / "data/chat_demo/tokenizer"), local_files_only=True)
    ds = build_chat_store(str(ROOT / "data/chat_demo/valid.jsonl"), tok, max_len=512, overlong="truncate",
                          skip_bad=False, cache_dir=tmp_path_factory.mktemp("cache"))
    samples = [ds[i] for i in range(12)]
    return Collator()(samples).to("cuda"), Collator(packed=True, token_buckets=(1024,))(samples).to("cuda")


def loss_grads(m, batch, loss_fn=None):
    m.zero_grad(set_to_none=True)
    loss = loss_fn(m, batch, None, False)[1] if loss_fn else lm_loss(m(batch), batch.labels)[0]
    loss.backward()
    return loss.detach().float(), {n: p.grad.float().clone() for n, p in m.named_parameters() if p.grad is not None}


def close(a, b, tol):
    la, ga = a
    lb, gb = b
    assert abs(float(la - lb)) <= tol * max(1.0, abs(float(la))), (float(la), float(lb))
    assert ga.keys() == gb.keys()
    errs = {n: float((ga[n] - gb[n]).norm() / (gb[n].norm() + 1e-12)) for n in ga}
    off = {n: f"{e:.2e}" for n, e in errs.items() if not e < 20 * tol}  # every one, so a failure shows the pattern
    assert not off, (off, f"worst within: {max((e for e in errs.values() if e < 20 * tol), default=0):.2e}")


def needs_fla():
    """fla installed and able to train here (on Hopper with Triton 3.4-3.7.0 through brisk's launcher)."""
    pytest.importorskip("fla")
    reason = K.fla_refusal([128])
    if reason:
        pytest.skip(reason)


@pytest.fixture
def torch_reference(monkeypatch):
    """The reference in plain torch. With fla importable, transformers' own Gated DeltaNet forward calls fla's
    chunk kernel (its hub-kernel fallback picks the package at import): per sequence against padded then
    compares fla with itself at two batch shapes, whose autotuned kernels sum in other orders (round 8: dt_bias's
    gradient 1.3e-2 relative apart in fp32), which says nothing about the packing. For these tests only, the
    layer's forward gets transformers' torch chunk function back; cuDNN's TF32 is off too, in case the short
    conv reaches cuDNN (both restored afterwards)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod
    import inspect

    monkeypatch.setattr(mod, "torch_chunk_gated_delta_rule", inspect.unwrap(mod.torch_chunk_gated_delta_rule))
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


def test_the_reference_packed_equals_padded_in_fp32(batches, torch_reference):
    """The per-conversation torch path that the fla tests compare with: packed == padded in fp32."""
    padded, packed = batches
    ref = model(QWEN3_5)
    K.apply_linear_attention_per_sequence(ref)
    close(loss_grads(ref, packed), loss_grads(ref, padded), 1e-5)


def test_fla_in_bf16_trains_like_the_reference_packed_and_padded(batches, torch_reference):
    """fla (brisk's launcher on Hopper) in bf16, the dtype brisk runs it in, on packed rows and on a padded batch,
    against the torch reference on the packed rows. fp32 is refused by the plan: round 9 measured fla's fp32
    gate gradient 4.0e-2 relative off the fp64 recurrence (likely TF32), and this model's dt_bias gradient 3.2 off."""
    needs_fla()
    padded, packed = batches
    ref, fast = model(QWEN3_5, "bf16"), model(QWEN3_5, "bf16")
    fast.load_state_dict(ref.state_dict())
    keys = list(fast.state_dict())
    K.apply_linear_attention_per_sequence(ref)
    note = K.apply_fla_linear_attention(fast)
    assert "2 Gated DeltaNet" in note and list(fast.state_dict()) == keys
    want = loss_grads(ref, packed)
    close(loss_grads(fast, packed), want, 2e-2)
    close(loss_grads(fast, padded), want, 2e-2)


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-4), ("bf16", 2e-2)])
def test_batched_linear_attention_on_cuda_equals_the_reference(batches, dtype, tol):
    """speed.linear_attention_batched on CUDA (transformers' torch Gated DeltaNet, fla off the path): a packed
    row's conversations as one padded batch give the per-conversation reference's loss and gradients."""
    if K.available("fla"):
        pytest.skip("transformers routes Gated DeltaNet to fla when it is importable; run without fla on the path")
    padded, packed = batches
    ref, fast = model(QWEN3_5, dtype), model(QWEN3_5, dtype)
    fast.load_state_dict(ref.state_dict())
    K.apply_linear_attention_per_sequence(ref)
    assert "2 Gated DeltaNet" in K.apply_linear_attention_batched(fast)
    want = loss_grads(ref, packed)
    close(loss_grads(fast, packed), want, tol)
    close(loss_grads(fast, padded), want, tol)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_liger_kernels_and_fused_loss(arch, batches, torch_reference):
    """liger's kernels against the plain modules in fp32. The hybrid's Gated DeltaNet layers run transformers'
    torch chunk function on both sides (torch_reference): with fla they would be fp32 fla, which the plan
    refuses, and whose cold compile and autotune at fp32 did not finish within round 10's 420 s call."""
    pytest.importorskip("liger_kernel")
    padded, _ = batches
    over = QWEN3_5 if arch == "qwen3_5" else []
    ref, fast = model(over), model(over)
    fast.load_state_dict(ref.state_dict())
    note = K.apply_liger_kernels(fast)
    assert "0 RMSNorms" not in note and "0 SwiGLU" not in note
    want = loss_grads(ref, padded)
    close(loss_grads(fast, padded), want, 1e-4)
    close(loss_grads(fast, padded, K.liger_loss()), want, 1e-4)


def _sync_sites(m, batch) -> list[str]:
    """Host reads of the device (synchronizing CUDA calls) during one forward + backward on a fresh copy of the
    batch's cu_seqlens (as a new step brings): for each, the innermost Python frames of brisk, fla and
    transformers that made it, so that a failure names them."""
    import traceback
    import warnings

    from dataclasses import replace

    batch = replace(batch, cu_seqlens=batch.cu_seqlens.clone())
    sites = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            stack = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
            ours = [f for f in stack if any(k in f.filename for k in ("brisk", "/fla/", "transformers"))]
            # a sync inside a C++ autograd node surfaces at loss.backward(), with none of those frames on the stack
            tag = "" if ours else "(autograd, no brisk/fla/transformers frame) "
            sites.append(tag + " < ".join(f"{Path(f.filename).name}:{f.lineno}({f.name})"
                                          for f in (ours or stack)[-3:][::-1]))

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            loss_grads(m, batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sites


def test_fla_syncs_a_step_do_not_grow_with_the_layers(batches):
    """fla gets one cu_seqlens object (and its host copy) for every Gated DeltaNet layer of a step, so its chunk
    indices are made once a step: a model with twice the layers reads the device from the host as often."""
    needs_fla()
    _, packed = batches
    eight = [QWEN3_5[0].replace("num_hidden_layers: 4", "num_hidden_layers: 8").replace(
        "layer_types: [linear_attention, full_attention, linear_attention, full_attention]",
        "layer_types: [linear_attention, full_attention, linear_attention, full_attention, linear_attention, "
        "full_attention, linear_attention, full_attention]")]
    four, more = model(QWEN3_5, "bf16"), model(eight, "bf16")  # the dtype fla runs in (fp32: refused)
    for m in (four, more):
        assert "Gated DeltaNet" in K.apply_fla_linear_attention(m)
        loss_grads(m, packed)  # fla's autotuning and first launches
    # Interleaved twice, the fewer of each kept: round 9's single measurement of the 4-layer model had one sync
    # more, inside the backward's C++ (no Python frame of brisk, fla or transformers), which the 8-layer model
    # measured after it did not have: a one-off, not a count that grows with the layers.
    runs = [(_sync_sites(four, packed), _sync_sites(more, packed)) for _ in range(2)]
    at_four, at_eight = min((r[0] for r in runs), key=len), min((r[1] for r in runs), key=len)
    assert len(at_eight) == len(at_four), {"4 layers": at_four, "8 layers": at_eight, "all": runs}
