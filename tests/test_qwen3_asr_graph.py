"""model.family=qwen3_asr under speed.cuda_graph, the parts that run on the CPU: the plan takes the switch (on CUDA
only), the static packed layout (a fixed token row, audio slots and cu_seqlens per bucket; the features left
unpadded, since the frozen audio tower runs eagerly before each replay), the audio rows of a static batch, the
graph examples of every bucket, and the step body on static inputs with the rows given from outside (what a
replay runs) against the eager step. The captured graphs themselves: tests/gpu/test_qwen3_asr_graph_cuda.py."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from brisk.config import ConfigError
from brisk.data.collate import Collator, collator_for
from brisk.families import family_of, get
from brisk.plan import make_plan
from brisk.speed.frozen import FrozenAudio
from brisk.speed.graph import GraphedStep
from brisk.speed.label_head import LabelHead
from brisk.train.optim import WarmupLR
from brisk.train.step import StepHooks, TrainStep

from .test_qwen3_asr import config, recipe_jsonl, samples_of

FROZEN = ("model.encoder.freeze=true", "model.adaptor.freeze=true")
GRAPH = ("speed.packing=true", "speed.frozen_eval=true", "speed.cuda_graph=true", *FROZEN)


def test_the_plan_takes_cuda_graph_on_cuda_and_refuses_it_on_the_cpu(tmp_path):
    cfg = config(tmp_path, *GRAPH, "speed.fresh_grads=true", "speed.fused_adamw=true",
                 "speed.optimizer_in_backward=true", "optim.grad_clip=0")
    _, plan = make_plan(cfg, "cuda", 1)
    assert {"cuda_graph", "fresh_grads", "optimizer_in_backward"} <= set(plan.on)
    with pytest.raises(ConfigError, match="speed.cuda_graph needs a CUDA device") as e:
        make_plan(cfg, "cpu", 1)
    assert "\n" not in str(e.value)
    # the preset: graphed on CUDA with the audio frozen, not on the CPU
    assert {"cuda_graph", "fresh_grads"} <= set(make_plan(config(tmp_path, "speed.preset=fast", *FROZEN), "cuda")[1].on)
    assert "cuda_graph" not in make_plan(config(tmp_path, "speed.preset=fast", *FROZEN), "cpu")[1].on
    with pytest.raises(ConfigError, match="speed.frozen_eval computes the audio rows without autograd"):
        config(tmp_path, "speed.packing=true", "speed.frozen_eval=true", "speed.cuda_graph=true")


def test_the_preset_graphs_the_step_with_the_tower_training_under_audio_varlen(tmp_path):
    """The recipe's work (every weight trains): the preset keeps cuda_graph and fresh_grads, the step graph then
    holds the tower (from its static inputs, audio_varlen) and compile takes its blocks; without audio_varlen the
    graph is refused in one line naming it."""
    from brisk.speed.compile import apply_compile

    cfg, plan = make_plan(config(tmp_path, "speed.preset=fast", f"speed.inductor_cache_dir={tmp_path / 'ind'}"), "cuda")
    assert not cfg.model.encoder.freeze and not cfg.model.adaptor.freeze
    assert {"cuda_graph", "fresh_grads", "audio_varlen", "compile"} <= set(plan.on) and "frozen_eval" not in plan.on
    model = family_of(cfg).build(cfg, "cpu")
    note = apply_compile(model, plan.speed, "cuda")
    compiled = {n for n, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None}
    assert {"audio_tower.layers.0", "llm.model.layers.0"} <= compiled and "training encoder block" in note
    with pytest.raises(ConfigError, match="only with speed.audio_varlen=true") as e:
        make_plan(config(tmp_path, "speed.packing=true", "speed.cuda_graph=true", "speed.audio_varlen=false"), "cuda")
    assert "\n" not in str(e.value)
    from brisk.config import load_config

    from .conftest import REPO

    # Fun-ASR-Nano's training encoder and adaptor: in the graph too (its speech padded to the buckets), but not
    # under the encoder's activation checkpointing (the recompute saves the RNG state on the host)
    nano = [f"train.output_dir={tmp_path / 'n'}", "speed.packing=true", "speed.cuda_graph=true"]
    cfg = load_config(REPO / "configs" / "demo.yaml", nano)
    assert not cfg.model.encoder.freeze and "cuda_graph" in make_plan(cfg, "cuda")[1].on
    with pytest.raises(ConfigError, match="set model.encoder.activation_checkpoint=0"):
        load_config(REPO / "configs" / "demo.yaml", nano + ["model.encoder.activation_checkpoint=1"])


def _static_and_packed(tmp_path, n=4):
    path, _ = recipe_jsonl(tmp_path, n)
    cfg = config(tmp_path, *GRAPH, f"data.train={path}")
    _, samples = samples_of(cfg, path, n)
    return cfg, samples, collator_for(cfg)(samples), Collator(packed=True, token_buckets=tuple(cfg.speed.pack_buckets))(samples)


def test_the_static_layout_fixes_the_token_row_and_leaves_the_features_unpadded(tmp_path):
    cfg, samples, static, packed = _static_and_packed(tmp_path)
    assert not get("qwen3_asr").audio_graphs and get("fun_asr_nano").audio_graphs
    t = packed.input_ids.shape[1]
    assert static.input_ids.shape == (1, t) and static.audio_pos.numel() == t  # a slot per position: fixed
    assert static.cu_seqlens.numel() == cfg.data.max_utts + 2 > packed.cu_seqlens.numel()
    assert static.speech.shape == packed.speech.shape  # the tower runs eagerly: no padded segments or frames
    real = packed.audio_pos.numel()
    assert torch.equal(static.audio_pos[:real], packed.audio_pos) and (static.audio_pos[real:] == t).all()
    # another group of the same bucket has the same shapes in everything the step graph reads
    other = collator_for(cfg)(samples[1:])
    assert other.input_ids.shape[1] == t
    for name in ("input_ids", "labels", "position_ids", "cu_seqlens", "audio_pos", "audio_utt", "audio_frame"):
        assert getattr(other, name).shape == getattr(static, name).shape, name


def test_the_audio_rows_of_a_static_batch_are_the_packed_rows_then_zeros(tmp_path):
    cfg, samples, static, packed = _static_and_packed(tmp_path)
    model = family_of(cfg).build(cfg, "cpu").eval()
    with torch.no_grad():
        ref = model.audio_rows(packed)
        # the lengths are not read (the host counts say it all): wrong ones change nothing
        rows = model.audio_rows(dataclasses.replace(static, speech_lengths=torch.ones_like(static.speech_lengths)))
        # features padded as a rank's common shape (more segments and frames) give the same rows
        n, f, d = static.speech.shape
        wide = torch.zeros(n + 3, f + 250, d)
        wide[:n, :f] = static.speech
        padded = model.audio_rows(dataclasses.replace(static, speech=wide, speech_lengths=torch.ones(n + 3, dtype=torch.long)))
    assert rows.shape == padded.shape == (static.audio_pos.numel(), ref.shape[1])
    torch.testing.assert_close(rows[: ref.shape[0]], ref, rtol=0, atol=1e-6)
    assert rows[ref.shape[0]:].abs().sum() == 0 and ref.shape[0] < rows.shape[0]
    torch.testing.assert_close(padded, rows, rtol=0, atol=1e-6)


def test_graph_examples_fill_each_bucket_up_to_the_limit(tmp_path):
    from brisk.train.step import model_loss

    cfg = config(tmp_path, *GRAPH, "speed.pack_buckets=[256,512,1024,4096]")
    collate = collator_for(cfg)
    batches = family_of(cfg).graph_examples(cfg, collate, 400, 1024)
    assert [b.input_ids.shape[1] for b in batches] == [256, 512, 1024]
    head = LabelHead(static=True, frac=cfg.speed.label_rows_frac)
    for b in batches:
        t = b.input_ids.shape[1]
        assert b.n_tokens == t and b.audio_pos.numel() == t and b.cu_seqlens.numel() == cfg.data.max_utts + 2
        assert b.slot_counts == [2]  # more than one audio row: compiled tower layers stay general
        assert head.rows(head.fit(b)) < t  # the bucket's common graph, not an all-rows one
    model = family_of(cfg).build(cfg, "cpu")
    _, loss, _, count = model_loss(model, head.fit(batches[0]), StepHooks(audio=FrozenAudio(model), loss=head))
    assert torch.isfinite(loss) and int(count) > 0


@pytest.mark.parametrize("persistent", [True, False])
def test_the_step_body_on_static_inputs_equals_the_eager_step(tmp_path, persistent):
    """What a replay runs: ``TrainStep.body`` on the static batch with the audio rows computed outside it (by the
    frozen provider, then copied in), persistent gradient buffers (or fresh ones, speed.fresh_grads) and the
    static label head; against the eager step on the plain packed batch. Three steps: losses, counts and the
    trained parameters."""
    cfg, samples, static, packed = _static_and_packed(tmp_path)
    model = family_of(cfg).build(cfg, "cpu")
    frac = cfg.speed.label_rows_frac

    def make(static_layout: bool):
        m = copy.deepcopy(model).train()
        params = [p for p in m.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-3)
        hooks = StepHooks(audio=FrozenAudio(m), loss=LabelHead(static=static_layout, frac=frac))
        step = TrainStep(m, opt, WarmupLR(opt, 1e-3, 2), grad_clip=1.0, hooks=hooks,
                         persistent_grads=static_layout and persistent)
        if step.persistent_grads:
            for p in params:
                p.grad = torch.zeros_like(p)
        return m, step

    eager_model, eager = make(False)
    graph_model, graphed = make(True)
    for _ in range(3):
        a = eager([packed])
        inputs = static._map(lambda x: x.clone())  # the graph's static inputs, filled by copies
        rows = graphed.hooks.audio(static).clone()
        b = graphed.body([inputs], [rows])
        graphed.advance(b)
        torch.testing.assert_close(b["loss"], a["loss"], rtol=0, atol=1e-5)
        assert int(b["count"]) == int(a["count"]) and int(b["correct"]) == int(a["correct"])
    trained = [n for n, p in eager_model.named_parameters() if p.requires_grad]
    assert trained and all(n.startswith("llm.") for n in trained)  # the audio path is frozen
    theirs = dict(graph_model.named_parameters())
    worst = max((p - theirs[n]).abs().max().item() for n, p in eager_model.named_parameters() if p.requires_grad)
    assert worst < 1e-5, worst
    assert any((p - dict(model.named_parameters())[n]).abs().max() > 0 for n, p in eager_model.named_parameters()
               if p.requires_grad)  # the steps did train


def eager_and_graphed(model):
    """Two copies of ``model`` in training mode with their plain AdamW steps: (eager model, eager step, graphed
    model, its step, a GraphedStep around it with the model's audio path training inside; made without __init__,
    which needs CUDA: its body and routing are what the CPU tests run)."""
    def make():
        m = copy.deepcopy(model).train()
        params = [p for p in m.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-3)
        return m, TrainStep(m, opt, WarmupLR(opt, 1e-3, 2), grad_clip=1.0, hooks=StepHooks())

    eager_model, eager = make()
    graph_model, step = make()
    graphed = GraphedStep.__new__(GraphedStep)
    graphed.step, graphed.trained = step, graph_model
    return eager_model, eager, graph_model, step, graphed


def test_the_step_body_with_the_tower_training_on_static_inputs_equals_the_eager_step(tmp_path):
    """What a replay runs with every weight training (GraphedStep._body with the model's audio path inside):
    the tower's rows from the bucket's static inputs (``static_audio_rows``), then the body on the static batch
    with fresh gradients; against the eager step on the plain packed batch, where the model computes its own
    rows. The one-call window attention in both (speed.audio_varlen). Three steps: losses, counts and every
    trained parameter, the tower's and projector's included."""
    from types import SimpleNamespace

    from brisk.speed.audio_varlen import apply_audio_varlen

    path, _ = recipe_jsonl(tmp_path, 4)
    cfg = config(tmp_path, "speed.packing=true", "speed.cuda_graph=true", "speed.audio_varlen=true", f"data.train={path}")
    _, samples = samples_of(cfg, path, 4)
    static = collator_for(cfg)(samples)
    packed = Collator(packed=True, token_buckets=tuple(cfg.speed.pack_buckets))(samples)
    model = family_of(cfg).build(cfg, "cpu")
    apply_audio_varlen([model.audio_tower.layers])

    eager_model, eager, graph_model, step, graphed = eager_and_graphed(model)
    theirs = dict(graph_model.named_parameters())
    for i in range(3):
        a = eager([packed])
        key, inputs = graphed._audio_inputs(static)
        assert key == (static.audio_pos.numel(), inputs[0].shape[0])  # fixed by the bucket's static layout
        b = graphed._body(static._map(lambda x: x.clone()), tuple(x.clone() for x in inputs))
        step.advance(b)
        torch.testing.assert_close(b["loss"], a["loss"], rtol=0, atol=1e-5)
        assert int(b["count"]) == int(a["count"]) and int(b["correct"]) == int(a["correct"])
        if i == 0:  # the first step's gradients, every one (the padding slots' rows add exactly nothing)
            for n, p in eager_model.named_parameters():
                if p.requires_grad:
                    torch.testing.assert_close(theirs[n].grad, p.grad, rtol=1e-4, atol=1e-7, msg=n)
    trained = {n for n, p in eager_model.named_parameters() if p.requires_grad}
    assert any(n.startswith("audio_tower.") for n in trained) and any(n.startswith("multi_modal_projector.") for n in trained)
    # after three AdamW steps: within 5% of each tensor's update, + 1e-6 (0.1% of an lr of 1e-3), for tensors whose
    # gradient is zero but for rounding (the keys' bias): AdamW divides a gradient by its own size
    start = dict(model.named_parameters())
    for n, p in eager_model.named_parameters():
        if p.requires_grad:
            moved = (p - start[n]).abs().max().item()
            assert moved > 0 and (p - theirs[n]).abs().max().item() <= 0.05 * moved + 1e-6, n
    # a padded batch (no graph takes it) runs the step eagerly: the model computes its own rows
    seen = []
    graphed.graphs, graphed.eager_fallbacks, graphed.fresh = {}, 0, True
    graphed.params = step.params
    graphed.step = SimpleNamespace(hooks=SimpleNamespace(loss=None, mark=lambda name: None), advance=lambda m: None,
                                   body=lambda batches, rows=None: seen.append(rows) or {"loss": torch.zeros(())})
    graphed([SimpleNamespace(input_ids=torch.zeros(1, 16, dtype=torch.long), layout="padded")])
    assert seen == [None] and graphed.eager_fallbacks == 1


def test_optimizer_in_backward_updates_the_decoder_layers_like_the_plain_fused_step(tmp_path):
    """speed.optimizer_in_backward on Qwen3-ASR (the family's decoder layers, as for Fun-ASR-Nano): the same
    parameters after two steps as the plain fused AdamW step, bit for bit."""
    from brisk.speed.optim_in_backward import apply_optimizer_in_backward
    from brisk.train.optim import build_optimizer, trainable_params

    cfg, _, _, packed = _static_and_packed(tmp_path)
    model = family_of(cfg).build(cfg, "cpu")

    def run(in_backward: bool):
        m = copy.deepcopy(model).train()
        opt = build_optimizer(m, cfg.optim, fused=True)
        hooks = StepHooks(audio=FrozenAudio(m))
        if in_backward:
            hooks.in_backward, _ = apply_optimizer_in_backward(family_of(cfg).decoder_layers(m), opt,
                                                               trainable_params(m), 0.0)
        step = TrainStep(m, opt, WarmupLR(opt, 1e-3, 2), grad_clip=0.0, on_device_skip=True, hooks=hooks)
        losses = [step([packed])["loss"] for _ in range(2)]
        return m, losses, hooks.in_backward

    (a, la, _), (b, lb, ib) = run(False), run(True)
    assert len(ib.buckets) == cfg.model.llm.config["text_config"]["num_hidden_layers"]
    assert all(torch.equal(x, y) for x, y in zip(la, lb))
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
