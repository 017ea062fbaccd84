"""speed.cuda_graph's audio side for Fun-ASR-Nano, the parts that run on the CPU: the family's hooks choose one
graph of the frozen encoder and adaptor per speech bucket (not the eager tower of Qwen3-ASR), the static collation
pads the speech to the speech buckets and the utterance slots, the examples captured up front cover every token and
speech bucket, and a step that falls back to eager computes its audio rows with the plain provider (no encoder
graph for a one-off shape). The graphs themselves: tests/gpu/test_gpu_state.py and the GPU scripts."""

from __future__ import annotations

import copy

import pytest
import torch

from brisk.data.collate import Collator, collator_for
from brisk.families import family_of, section
from brisk.models.build import build_model
from brisk.plan import make_plan
from brisk.speed.frozen import FrozenAudio
from brisk.speed.graph import MAX_GRAPH_TOKENS, GraphedAudioInputs, GraphedEncoder, GraphedStep
from brisk.families.fun_asr_nano.data import graph_examples
from brisk.train.optim import WarmupLR, build_optimizer
from brisk.train.step import StepHooks, TrainStep

from .conftest import tiny_config

GRAPH = {"speed.packing": True, "speed.cuda_graph": True, "speed.frozen_eval": True, "model.encoder.freeze": True,
         "model.adaptor.freeze": True, "fun_asr_nano.frontend.dither": 0.0, "fun_asr_nano.encoder.dropout_rate": 0.0}


def _cfg(tmp_path, **extra):
    cfg, _ = make_plan(tiny_config(tmp_path, **GRAPH, **extra), "cuda", 1)
    return cfg


def test_fun_asr_nano_graphs_its_frozen_audio_per_speech_bucket(tmp_path):
    cfg = _cfg(tmp_path)
    family = family_of(cfg)
    assert family.audio_graphs and not family.audio_static_inputs(cfg.speed)
    assert family.graph_examples.__module__ == "brisk.families.fun_asr_nano"  # its spec's part, over data.py's
    collate = collator_for(cfg)
    assert collate.static and collate.static_speech and collate.pad_utts == cfg.data.max_utts


def test_the_examples_captured_up_front_cover_every_bucket_in_static_shapes(tmp_path):
    cfg = _cfg(tmp_path, **{"speed.pack_buckets": [256, 512], "speed.speech_buckets": [64, 128, 256]})
    batches = family_of(cfg).graph_examples(cfg, collator_for(cfg), 483, MAX_GRAPH_TOKENS)
    assert [b.input_ids.shape[1] for b in batches[:2]] == [256, 512]
    assert sorted({b.speech.shape[1] for b in batches}) == [64, 128, 256]
    dim = section(cfg).frontend.n_mels * section(cfg).frontend.lfr_m
    for b in batches:  # every example padded as training's batches are: the encoder graphs see their shapes
        assert b.layout == "packed" and b.speech.shape[0] == cfg.data.max_utts and b.speech.shape[2] == dim
        assert b.cu_seqlens.numel() == cfg.data.max_utts + 2 and b.audio_pos.numel() == b.input_ids.shape[1]
    # without static_speech (a family whose audio runs eagerly) the same sample keeps its own frame count
    plain = Collator(**{**collator_for(cfg).__dict__, "static_speech": False})
    one = graph_examples(cfg, plain, 483, MAX_GRAPH_TOKENS)[0]
    assert one.speech.shape[0] == 1 and one.speech.shape[1] == int(one.speech_lengths.max()) < batches[0].speech.shape[1]


def _graphed(cfg, model, monkeypatch, **kw):
    # The pool handle is the one CUDA call GraphedStep's constructor makes; nothing is captured in these tests.
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))
    audio = FrozenAudio(model)
    opt = build_optimizer(model, cfg.optim, fused=True, capturable=True)
    step = TrainStep(model, opt, WarmupLR(opt, cfg.optim.lr, 2), grad_clip=1.0, on_device_skip=True,
                     persistent_grads=True, hooks=StepHooks(audio=audio))
    return GraphedStep(step, audio, **kw), audio


@pytest.mark.parametrize("audio_graphs, static_audio, kind", [(True, False, GraphedEncoder),
                                                                (False, True, GraphedAudioInputs),
                                                                (False, False, None)])
def test_the_graphed_step_takes_the_audio_provider_its_family_asks_for(tmp_path, monkeypatch, audio_graphs,
                                                                        static_audio, kind):
    cfg = _cfg(tmp_path)
    graphed, audio = _graphed(cfg, build_model(cfg), monkeypatch, audio_graphs=audio_graphs,
                              static_audio=static_audio)
    assert graphed.plain_audio is audio
    if kind is None:  # the provider itself, eagerly before each replay
        assert graphed.audio is audio
    else:
        assert isinstance(graphed.encoder, kind) and graphed.audio.encoder is graphed.encoder
        assert graphed.audio is not audio and audio.encoder == audio.path.audio_rows  # the original left as it was


@pytest.mark.parametrize("layout", ["padded", "packed past the graph limit"])
def test_an_eager_fallback_step_computes_its_audio_rows_eagerly(tmp_path, monkeypatch, layout):
    """A batch no graph takes (a padded one, or a static packed row longer than MAX_GRAPH_TOKENS) runs the eager
    step with the plain provider's rows: the same loss as the plain step, and no encoder graph captured for its
    one-off speech shape (on the CPU a capture would fail)."""
    from brisk.data.loader import build_split
    from brisk.speed import graph

    cfg = _cfg(tmp_path)
    collate = Collator() if layout == "padded" else collator_for(cfg)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    for m in (model.audio_encoder, model.audio_adaptor):
        m.eval()
    ref_model = copy.deepcopy(model)
    fam = family_of(cfg)
    graphed, _ = _graphed(cfg, model, monkeypatch, audio_graphs=fam.audio_graphs,
                          static_audio=fam.audio_static_inputs(cfg.speed))
    split = build_split(cfg, "train", collate, 483)
    batch = collate([split.dataset[(i, 0)] for i in split.sampler.batches(0)[0][:3]])
    if layout != "padded":
        assert batch.layout == "packed" and batch.speech.shape[0] == cfg.data.max_utts  # the static layout
        monkeypatch.setattr(graph, "MAX_GRAPH_TOKENS", batch.input_ids.shape[1] - 1)
    got = graphed([batch])
    opt = build_optimizer(ref_model, cfg.optim, fused=True, capturable=True)
    ref = TrainStep(ref_model, opt, WarmupLR(opt, cfg.optim.lr, 2), grad_clip=1.0, on_device_skip=True,
                    persistent_grads=True, hooks=StepHooks(audio=FrozenAudio(ref_model)))([batch])
    assert graphed.eager_fallbacks == 1 and not graphed.encoder.graphs and not graphed.graphs
    assert torch.equal(got["loss"], ref["loss"]) and int(got["count"]) == int(ref["count"]) > 0


def test_the_body_with_the_encoder_training_on_the_static_batch_equals_the_eager_step(tmp_path):
    """The demo trains its encoder and adaptor: under speed.cuda_graph the step graph holds them, on the speech padded
    to its bucket and segments (the model's ``static_audio_inputs``/``static_audio_rows``). What a replay runs
    (GraphedStep._body with the training audio path) against the eager step on the plain packed batch: three
    AdamW steps, losses, counts and every trained parameter, the encoder's and adaptor's included."""

    from brisk.data.loader import build_split

    cfg, _ = make_plan(tiny_config(tmp_path, **{"speed.packing": True, "speed.cuda_graph": True,
                                                "fun_asr_nano.frontend.dither": 0.0,
                                                "fun_asr_nano.encoder.dropout_rate": 0.0}), "cuda", 1)
    assert not cfg.model.encoder.freeze and not cfg.speed.frozen_eval
    static_collate = collator_for(cfg)
    split = build_split(cfg, "train", static_collate, 483)
    samples = [split.dataset[(i, 0)] for i in split.sampler.batches(0)[0][:3]]
    static = static_collate(samples)
    packed = Collator(packed=True, token_buckets=tuple(cfg.speed.pack_buckets))(samples)
    assert static.speech.shape[0] == cfg.data.max_utts > packed.speech.shape[0]  # padded segments and frames
    torch.manual_seed(0)
    model = build_model(cfg)
    for p in model.ctc.parameters() if getattr(model, "ctc", None) is not None else ():
        p.requires_grad_(False)  # outside the loss (the family's outside_loss): no gradient either way

    from .test_qwen3_asr_graph import eager_and_graphed

    eager_model, eager, graph_model, step, graphed = eager_and_graphed(model)
    theirs = dict(graph_model.named_parameters())
    for i in range(3):
        a = eager([packed])
        key, inputs = graphed._audio_inputs(static)
        assert key == (tuple(static.speech.shape), static.audio_utt.numel())
        b = graphed._body(static._map(lambda x: x.clone()), tuple(x.clone() for x in inputs))
        step.advance(b)
        torch.testing.assert_close(b["loss"], a["loss"], rtol=0, atol=1e-5)
        assert int(b["count"]) == int(a["count"]) > 0
        if i == 0:  # the first step's gradients, every one (the padded segments and frames add nothing)
            for n, p in eager_model.named_parameters():
                if p.grad is not None:
                    torch.testing.assert_close(theirs[n].grad, p.grad, rtol=1e-4, atol=1e-7, msg=n)
    start = dict(model.named_parameters())
    trained = [n for n, p in eager_model.named_parameters() if p.requires_grad]
    assert any(n.startswith("audio_encoder.") for n in trained) and any(n.startswith("audio_adaptor.") for n in trained)
    for n, p in eager_model.named_parameters():
        if p.requires_grad:
            moved = (p - start[n]).abs().max().item()
            # within 5% of its update, + 5e-6 (0.5% of an lr of 1e-3) for the near-zero gradients AdamW scales up
            assert moved > 0 and (p - theirs[n]).abs().max().item() <= 0.05 * moved + 5e-6, n
