"""speed.fuse_projections: the same loss and gradients with fewer GEMMs, the same parameters and state dict."""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError
from brisk.data.loader import build_split
from brisk.models.build import build_model
from brisk.data.collate import collator_for
from brisk.speed.fuse import apply_fuse_projections
from brisk.train.step import StepHooks, model_loss

from .conftest import speed_parts, tiny_config

CPU = torch.device("cpu")


def _model_and_batch(tmp_path, **extra):
    cfg = tiny_config(tmp_path, **extra)
    torch.manual_seed(0)
    model = build_model(cfg).eval()  # eval: no dropout, so two forwards are comparable
    split = build_split(cfg, "train", collator_for(cfg), model.llm.get_input_embeddings().weight.shape[0])
    batch = collator_for(cfg)([split.dataset[(i, 0)] for i in split.sampler.batches(0)[0]])
    return cfg, model, batch


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    _, loss, _, _ = model_loss(model, batch, StepHooks())
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_fused_projections_give_the_same_loss_and_gradients(tmp_path, packing):
    cfg, model, batch = _model_and_batch(tmp_path, **{"speed.packing": packing})
    state = {k: (v.data_ptr(), v.shape) for k, v in model.state_dict().items()}
    loss0, grads0 = _loss_and_grads(model, batch)
    note = apply_fuse_projections(model.llm)
    assert "decoder layers" in note
    assert {k: (v.data_ptr(), v.shape) for k, v in model.state_dict().items()} == state  # the very same tensors
    loss1, grads1 = _loss_and_grads(model, batch)
    assert abs(loss1 - loss0) <= 1e-6 * abs(loss0)
    assert grads1.keys() == grads0.keys() and any("q_proj" in k for k in grads0)
    for k in grads0:
        assert torch.allclose(grads1[k], grads0[k], rtol=1e-5, atol=1e-7), k


def test_fused_projections_trace_fewer_linears_and_no_graph_break(tmp_path):
    cfg, model, batch = _model_and_batch(tmp_path)
    llm = model.llm
    ids = batch.input_ids[:, :16].clone()

    def count(module):
        graphs, linears = [], []

        def backend(gm, example_inputs):
            graphs.append(gm)
            linears.append(sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is torch._C._nn.linear))
            return gm.forward

        torch._dynamo.reset()
        out = torch.compile(module, backend=backend)(input_ids=ids, use_cache=False).logits  # as in training
        return len(graphs), sum(linears), out

    graphs0, linears0, out0 = count(llm)
    apply_fuse_projections(llm)
    graphs1, linears1, out1 = count(llm)
    torch._dynamo.reset()
    n_layers = llm.config.num_hidden_layers
    assert graphs1 == graphs0  # the fused forwards add no graph break
    assert linears0 - linears1 == 3 * n_layers  # q/k/v: 3 -> 1, gate/up: 2 -> 1 in every layer
    assert torch.allclose(out1, out0, rtol=1e-5, atol=1e-6)


def test_fused_modules_are_swapped_in_and_hold_the_same_children(tmp_path):
    """Module swaps, not patches: the attention and MLP are instances of subclasses of their own classes that
    hold the very same child modules; the projections themselves stay plain nn.Linear, and no instance carries
    a forward of its own."""
    _, model, _ = _model_and_batch(tmp_path)
    layer = model.llm.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    children = {n: m for n, m in layer.named_modules()}
    apply_fuse_projections(model.llm)
    assert type(layer.self_attn) is not type(attn) and isinstance(layer.self_attn, type(attn))
    assert isinstance(layer.mlp, type(mlp)) and type(layer.mlp).__name__.startswith("Fused")
    assert all(m is children[n] for n, m in layer.named_modules() if n not in ("", "self_attn", "mlp"))
    assert type(layer.self_attn.q_proj) is torch.nn.Linear
    assert not any("forward" in m.__dict__ for m in model.modules())
    # one fused class for every layer: Dynamo's guard on the code object holds for all of them
    assert len({type(lay.self_attn) for lay in model.llm.model.layers}) == 1


def test_fuse_projections_is_a_config_switch_and_refuses_fsdp(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.fuse_projections": True})
    model = build_model(cfg)
    _, plan, parts = speed_parts(model, cfg)
    assert any(n.startswith("fuse_projections:") for n in parts.notes)
    assert type(model.llm.model.layers[0].mlp).__name__.startswith("Fused")
    from brisk.diagnose.accel import acceleration_state
    from brisk.diagnose.report import one_line

    assert "fuse_projections" in one_line(acceleration_state(cfg, CPU, plan)).split("switches=")[1].split(" |")[0]
    with pytest.raises(ConfigError, match="fuse_projections"):  # at load time, before any model
        tiny_config(tmp_path, **{"speed.fuse_projections": True, "train.parallel": "fsdp"})


def test_fused_projections_under_aot_autograd_give_the_eager_gradients(tmp_path):
    """What speed.compile runs on the GPU, with the CPU's aot_eager backend: forward and backward graphs."""
    _, model, batch = _model_and_batch(tmp_path)
    llm = model.llm
    ids = batch.input_ids[:, :16].clone()
    apply_fuse_projections(llm)
    grads = []
    for run in (llm, torch.compile(llm, backend="aot_eager")):
        llm.zero_grad(set_to_none=True)
        run(input_ids=ids, use_cache=False).logits.float().square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in llm.named_parameters() if p.grad is not None})
    torch._dynamo.reset()
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], rtol=1e-5, atol=1e-7), k


def _per_layer_graphs(llm, ids) -> int:
    """Graphs Dynamo builds when every decoder layer's forward is compiled on its own, as speed.compile's
    default scope does (one code object for all layers: one graph serves them all)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    for layer in llm.model.layers:
        layer.compile(backend=backend, dynamic=True)  # as speed.compile does (nn.Module.compile)
    llm(input_ids=ids, use_cache=False).logits.sum().backward()  # as in training: no KV cache
    for layer in llm.model.layers:
        layer._compiled_call_impl = None  # the test's own compile undone (torch keeps it there)
    torch._dynamo.reset()
    return len(graphs)


def test_per_layer_compile_keeps_one_graph_for_all_layers(tmp_path):
    """The fused modules must not make Dynamo compile a graph per layer (past 8 layers the rest would silently
    run uncompiled): the guard holds for every layer, as without the switch."""
    _, model, batch = _model_and_batch(tmp_path, **{"model.llm.config.num_hidden_layers": 10})
    llm, ids = model.llm, batch.input_ids[:, :16].clone()
    assert _per_layer_graphs(llm, ids) == 1
    apply_fuse_projections(llm)
    assert _per_layer_graphs(llm, ids) == 1


def test_without_autograd_the_plain_projections_run(tmp_path):
    _, model, batch = _model_and_batch(tmp_path)
    llm, ids = model.llm, batch.input_ids[:, :16].clone()
    with torch.no_grad():
        want = llm(input_ids=ids).logits
        apply_fuse_projections(llm)
        got = llm(input_ids=ids).logits
    assert torch.equal(got, want)  # the very same GEMMs
