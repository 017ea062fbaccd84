"""speed.flex_attention on the CPU (forward only: FlexAttention has no CPU backward; tests/gpu/test_flex_attention_cuda.py
trains with it): the block mask built from cu_seqlens is torch's own create_block_mask of the document-causal
mask, the attention equals the packed reference, the model's logits do not change, and the plan asks for what
the switch needs."""

from __future__ import annotations

import random

import pytest
import torch

from brisk.config import load_config
from brisk.data.collate import Collator
from brisk.errors import ConfigError
from brisk.models.build import build_model
from brisk.plan import make_plan
from brisk.speed.flex import (INLINE, LENGTHS, MASK_KEY, NAME, apply_flex_attention, document_block_mask,
                              flex_attention_fn)
from brisk.speed.varlen import block_causal_mask, padded_attention, varlen_attention

from .conftest import DEMO_CONFIG, tiny_overrides
from .test_packing import _samples

flex = pytest.importorskip("torch.nn.attention.flex_attention")


def _layouts(n: int, seed: int = 0):
    """n random packed rows: (cu_seqlens, length, tile), empty sequences and short last tiles among them."""
    rng = random.Random(seed)
    for _ in range(n):
        length = rng.choice([128, 256, 300, 384, 1000, 1792])
        cuts = sorted(rng.choices(range(length + 1), k=rng.randint(1, 12)))
        yield torch.tensor([0, *cuts, length]), length, rng.choice([16, 32, 128])


def test_block_mask_is_torch_create_block_mask_of_the_document_causal_mask():
    full = 0
    for cu, length, tile in _layouts(60):
        dense = block_causal_mask(cu, length)
        ours = document_block_mask(cu, length, tile)
        ref = flex.create_block_mask(lambda b, h, q, kv: dense[q, kv], None, None, length, length, device="cpu",
                                     BLOCK_SIZE=tile, _compile=False)
        for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
            assert torch.equal(getattr(ours, name), getattr(ref, name)), (name, cu.tolist(), length, tile)
        assert torch.equal(ours.to_dense(), ref.to_dense())
        full += int(ours.full_kv_num_blocks.sum())
    assert full > 0  # the layouts exercise full tiles (no mask function), not only partial ones


def test_flex_attention_equals_the_packed_reference_with_gqa():
    torch.manual_seed(0)
    for cu, length, _ in _layouts(6, seed=1):
        q = torch.randn(1, 4, length, 16)
        k, v = torch.randn(1, 2, length, 16), torch.randn(1, 2, length, 16)
        mask = document_block_mask(cu, length)
        got, _ = flex_attention_fn(None, q, k, v, None, scaling=0.3, **{MASK_KEY: mask})
        want, _ = varlen_attention(None, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu)
        assert got.shape == want.shape == (1, length, 4, 16)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        assert not torch.equal(got, want)  # two kernels: FlexAttention ran, not the reference
        with torch.no_grad():  # validation: brisk_varlen's computation itself
            routed, _ = flex_attention_fn(None, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu, **{MASK_KEY: mask})
        assert torch.equal(routed, want)


def test_static_flex_compiles_a_graph_per_length_inside_a_dynamic_layer(monkeypatch):
    """The call compiled on its own: inside a layer compiled with dynamic shapes it keeps one static graph per row
    length, past Dynamo's default limit of 8, and the layer keeps its one dynamic graph; a length past its own
    limit raises (fullgraph) instead of running FlexAttention's unfused reference. Forward only on the CPU
    (aot_eager: no Inductor code)."""
    import torch._dynamo.config as dc
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from brisk.speed import flex as flex_module

    torch._dynamo.reset()
    assert dc.recompile_limit < 10 <= LENGTHS

    def layer(q, k, v, mask):
        return flex_module.static_flex(q * 2, k, v, mask, 0.3).sin()

    compiled = torch.compile(layer, dynamic=True, backend="aot_eager")

    def row(length):
        cu = torch.tensor([0, length // 3, length // 2, length])
        q, k, v = torch.randn(1, 4, length, 16), torch.randn(1, 2, length, 16), torch.randn(1, 2, length, 16)
        return q, k, v, document_block_mask(cu, length, 32)

    for length in range(64, 384, 32):  # 10 lengths
        q, k, v, mask = row(length)
        assert torch.equal(compiled(q, k, v, mask), flex_module.flex(q * 2, k, v, mask, 0.3).sin())
    assert len(_debug_get_cache_entry_list(flex_module.flex.__code__)) == 10
    assert len(_debug_get_cache_entry_list(layer.__code__)) == 1
    monkeypatch.setattr(flex_module, "LENGTHS", 10)
    with pytest.raises(Exception, match="fullgraph"):
        compiled(*row(384))
    torch._dynamo.reset()


def _three_rows_compiled(tmp_path, inline: bool):
    """The tiny model (3 decoder layers) with brisk_flex, its layers compiled as speed.compile compiles them
    (aot_eager on the CPU: dynamic shapes, or static with ``inline``), run on rows of 256, 256 and 512 tokens: the
    logits are the eager model's, a second batch of a seen length compiles nothing, a new length exactly one
    graph. Returns apply_flex_attention's note and the layers; Dynamo is reset by the caller."""
    from brisk.speed.compile import compile_counters, decoder_stack

    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0,
                                                               "model.llm.config.num_hidden_layers": 3}))
    model = build_model(cfg).eval().requires_grad_(False)  # autograd on, nothing to differentiate (CPU)
    note = apply_flex_attention(model.llm, inline=inline)
    collate = Collator(packed=True, token_buckets=(256, 512), speech_buckets=(32, 64), pad_utts=8, static=True)
    batches = [collate(_samples(cfg, n)) for n in (2, 3, 8)]
    assert [b.input_ids.shape[1] for b in batches] == [256, 256, 512]
    chosen = model.llm.config._attn_implementation
    model.llm.set_attn_implementation(NAME)  # the eager reference: FlexAttention compiled apart (eager inline: varlen)
    eager = [model(b) for b in batches]
    model.llm.set_attn_implementation(chosen)
    torch._dynamo.reset()
    layers = decoder_stack(model.llm).layers
    for layer in layers:
        layer.compile(dynamic=not inline, backend="aot_eager")
    graphs = []
    for batch, want in zip(batches, eager):
        assert torch.equal(model(batch), want)
        graphs.append(compile_counters()["graphs"])
    assert graphs[1] == graphs[0] and graphs[2] == graphs[1] + 1, graphs
    return note, layers


def test_compiled_layers_break_out_to_one_static_graph_per_length(tmp_path):
    """Dynamic layers (speed.compile's default): the new length's one graph is FlexAttention's static one, compiled
    apart (the layers' graphs around the break serve every length)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from brisk.speed import flex as flex_module

    _three_rows_compiled(tmp_path, inline=False)
    assert len(_debug_get_cache_entry_list(flex_module.flex.__code__)) == 2
    torch._dynamo.reset()


def test_static_layers_trace_flex_inline_one_graph_per_length(tmp_path):
    """speed.compile_dynamic=false: FlexAttention is traced into the static layers (no break, nothing compiled
    for ``flex`` on its own), and each row length is one layer graph."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from brisk.speed import flex as flex_module

    note, layers = _three_rows_compiled(tmp_path, inline=True)
    assert "traced into the static layers" in note and layers[0].self_attn.config._attn_implementation == INLINE
    assert _debug_get_cache_entry_list(flex_module.flex.__code__) == []
    assert len(_debug_get_cache_entry_list(type(layers[0]).forward.__code__)) == 2
    torch._dynamo.reset()


def test_flops_are_counted_through_varlen(tmp_path):
    """torch's FlopCounterMode raises inside FlexAttention's higher-order op; the bench's and the profile's count
    (harness.count_flops) runs brisk_varlen on the same row instead, and counts what the varlen model counts."""
    from torch.utils.flop_counter import FlopCounterMode

    from brisk.speed.flex import varlen_for_counting
    from brisk.speed.varlen import apply_varlen_attention

    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0}))
    model = build_model(cfg).eval().requires_grad_(False)  # autograd on, so brisk_flex runs FlexAttention
    batch = Collator(packed=True, token_buckets=(256,), speech_buckets=(32, 64), pad_utts=8, static=True)(
        _samples(cfg, 3))
    apply_varlen_attention(model.llm)
    with FlopCounterMode(display=False) as fc:
        model(batch)
    want = fc.get_total_flops()
    apply_flex_attention(model.llm)
    with pytest.raises(Exception, match="flex_attention"), FlopCounterMode(display=False):
        model(batch)
    torch._dynamo.reset()  # the failed compile left static_flex's code marked skipped for this process
    with varlen_for_counting(model.llm), FlopCounterMode(display=False) as fc:
        model(batch)
    assert fc.get_total_flops() == want > 0
    assert model.llm.config._attn_implementation == "brisk_flex"


def test_inline_call_outside_a_compile_takes_varlen():
    """A static layer that Dynamo gave up on runs eagerly: brisk_flex_inline then takes varlen_attn's path on the
    row, not FlexAttention's unfused reference (a [H, T, T] score matrix a layer)."""
    from functools import partial

    from brisk.speed.flex import flex

    cu = torch.tensor([0, 40, 64, 128])
    q, k, v = torch.randn(1, 4, 128, 16), torch.randn(1, 2, 128, 16), torch.randn(1, 2, 128, 16)
    kwargs = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 64, "max_length_k": 64,
              MASK_KEY: document_block_mask(cu, 128, 32)}
    got = partial(flex_attention_fn, call=flex)(None, q, k, v, None, scaling=0.25, **kwargs)[0]
    want = varlen_attention(None, q, k, v, None, scaling=0.25, **kwargs)[0]
    assert torch.equal(got, want)
    assert not torch.equal(got, flex(q, k, v, kwargs[MASK_KEY], 0.25).transpose(1, 2))  # not FlexAttention's


def test_padded_batch_is_refused_by_name():
    q = torch.randn(2, 4, 8, 16)
    with pytest.raises(ValueError, match="brisk_flex attention needs a packed batch"):
        flex_attention_fn(None, q, q, q, None)


def test_model_logits_unchanged_and_decoding_goes_back_to_sdpa(tmp_path):
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0}))
    model = build_model(cfg).eval().requires_grad_(False)  # autograd on, nothing to differentiate (CPU)
    batch = Collator(packed=True, token_buckets=(256, 512), speech_buckets=(32, 64), pad_utts=8, static=True)(
        _samples(cfg, 5))
    plain = model(batch)
    note = apply_flex_attention(model.llm)
    got = model(batch)
    with torch.no_grad():
        validation = model(batch)
    assert "brisk_flex" in note and model.llm.config._attn_implementation == "brisk_flex"
    real = torch.arange(batch.input_ids.shape[1]) < int(batch.cu_seqlens[5])  # the five utterances' tokens
    assert 0 < int(real.sum()) < batch.input_ids.shape[1]
    assert torch.allclose(got[0, real], plain[0, real], atol=1e-4), (got[0, real] - plain[0, real]).abs().max()
    assert not torch.equal(got[0, real], plain[0, real])  # FlexAttention ran
    assert torch.allclose(validation[0, real], plain[0, real], atol=1e-5)
    with padded_attention(model.llm):
        assert model.llm.config._attn_implementation == "sdpa"
    assert model.llm.config._attn_implementation == "brisk_flex"


def test_plan_asks_for_packing_compile_and_cuda(tmp_path):
    base = tiny_overrides(tmp_path)
    with pytest.raises(ConfigError, match="speed.flex_attention .*speed.packing=true and speed.compile=true"):
        load_config(DEMO_CONFIG, base + ["speed.flex_attention=true", "speed.packing=true"])
    cfg = load_config(DEMO_CONFIG, base + ["speed.flex_attention=true", "speed.packing=true", "speed.compile=true"])
    with pytest.raises(ConfigError, match="speed.flex_attention needs a CUDA device.*cpu"):
        make_plan(cfg, "cpu")
    _, plan = make_plan(cfg, "cuda")
    assert "flex_attention" in plan.on
    with pytest.raises(ConfigError, match="compile_scope=layer only"):
        load_config(DEMO_CONFIG, base + ["speed.flex_attention=true", "speed.packing=true", "speed.compile=true",
                                         "speed.compile_scope=stack"])
    with pytest.raises(ConfigError, match="model.llm.activation_checkpoint is untested"):
        load_config(DEMO_CONFIG, base + ["speed.flex_attention=true", "speed.packing=true", "speed.compile=true",
                                         "model.llm.activation_checkpoint=1"])
    with pytest.raises(ConfigError, match="does not take speed.flex_attention"):
        load_config("qwen3_asr_demo", [f"train.output_dir={tmp_path}", "speed.flex_attention=true",
                                        "speed.packing=true", "speed.compile=true"])
