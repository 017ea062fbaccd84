"""The chat family under speed.cuda_graph, the parts that run on the CPU: the plan takes the switch for a
full-attention model on CUDA and refuses, in one line each, the CPU, liger's fused loss and Gated DeltaNet
layers; the static packed layout (a fixed row and cu_seqlens a bucket); the step body on the static batch, with
no audio, against the eager step on the plain packed batch (what a replay runs), and the graphed step's routing
of a batch no graph takes. The captured graphs themselves: tests/gpu/test_chat_graph_cuda.py."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from brisk.config import ConfigError
from brisk.data.collate import Collator, collator_for
from brisk.families import family_of
from brisk.plan import make_plan
from brisk.speed.graph import GraphedStep
from brisk.speed.label_head import LabelHead
from brisk.train.optim import WarmupLR
from brisk.train.step import StepHooks, TrainStep

from .test_chat_model import QWEN3, QWEN3_5, chat_cfg, samples  # noqa: F401 (a fixture)

GRAPH = ["speed.packing=true", "speed.cuda_graph=true", "speed.fused_adamw=true"]


def _cfg(tmp_path, *extra):
    return chat_cfg([f"train.output_dir={tmp_path / 'run'}", "data.num_workers=0", *QWEN3, *extra])


def test_the_plan_takes_cuda_graph_for_a_full_attention_chat_model_on_cuda(tmp_path):
    _, plan = make_plan(_cfg(tmp_path, *GRAPH, "speed.fresh_grads=true", "speed.label_head=true"), "cuda", 1)
    assert {"cuda_graph", "fresh_grads", "label_head"} <= set(plan.on) and plan.capturable
    with pytest.raises(ConfigError, match="speed.cuda_graph needs a CUDA device"):
        make_plan(_cfg(tmp_path, *GRAPH), "cpu", 1)
    with pytest.raises(ConfigError, match="speed.liger_loss=false") as e:
        _cfg(tmp_path, *GRAPH, "speed.liger_loss=true")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="set speed.fla_kernels=true") as e:  # the torch paths read the host
        chat_cfg([f"train.output_dir={tmp_path / 'run'}", *QWEN3_5, *GRAPH])
    assert "\n" not in str(e.value)
    _, plan = make_plan(chat_cfg([f"train.output_dir={tmp_path / 'run'}", *QWEN3_5, *GRAPH, "speed.fla_kernels=true",
                                  "model.llm.dtype=bf16"]),
                        "cuda", 1)
    assert {"cuda_graph", "fla_kernels"} <= set(plan.on)
    # the speech families still need their audio path frozen or inside the graph
    assert family_of(_cfg(tmp_path)).audio_path == ()


def test_the_static_layout_fixes_the_row_and_cu_seqlens_a_bucket(tmp_path, samples):  # noqa: F811
    cfg = _cfg(tmp_path, *GRAPH, "speed.pack_buckets=[1024,2048]")
    collate = collator_for(cfg)
    shapes = {tuple(b.input_ids.shape) + tuple(b.cu_seqlens.shape) for b in (collate(samples[:3]), collate(samples[1:4]))}
    assert shapes == {(1, 1024, cfg.data.max_utts + 2)}


@pytest.mark.parametrize("head", [False, True])
def test_the_step_body_on_the_static_batch_equals_the_eager_step(tmp_path, samples, head):  # noqa: F811
    """What a replay runs for a text-only model: GraphedStep._body with no audio on the static batch (zero-length
    sequences closing cu_seqlens), fresh gradients; against the eager step on the plain packed batch. Three
    steps: losses, counts and every trained parameter."""
    from brisk.speed.varlen import apply_varlen_attention

    cfg = _cfg(tmp_path, *GRAPH, "speed.pack_buckets=[1024,2048]")
    static = collator_for(cfg)(samples[:4])
    packed = Collator(packed=True, token_buckets=(1024, 2048))(samples[:4])
    assert static.cu_seqlens.numel() > packed.cu_seqlens.numel()
    model = family_of(cfg).build(cfg, "cpu")
    apply_varlen_attention(model.llm)

    def make(static_layout: bool):
        m = copy.deepcopy(model).train()
        params = [p for p in m.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-3)
        hooks = StepHooks(loss=LabelHead(static=static_layout, frac=cfg.speed.label_rows_frac) if head else None)
        return m, TrainStep(m, opt, WarmupLR(opt, 1e-3, 2), grad_clip=1.0, hooks=hooks)

    eager_model, eager = make(False)
    graph_model, step = make(True)
    graphed = GraphedStep.__new__(GraphedStep)  # __init__ needs CUDA (graph pools); the body is under test
    graphed.step, graphed.trained, graphed.audio, graphed.plain_audio = step, None, None, None
    for _ in range(3):
        a = eager([packed])
        audio_key, audio = graphed._audio_inputs(static)
        assert audio_key is None and audio is None  # nothing of audio: the body takes the batch alone
        b = graphed._body(static._map(lambda x: x.clone()), audio)
        step.advance(b)
        torch.testing.assert_close(b["loss"], a["loss"], rtol=0, atol=1e-5)
        assert int(b["count"]) == int(a["count"]) > 0
    start, theirs = dict(model.named_parameters()), dict(graph_model.named_parameters())
    for n, p in eager_model.named_parameters():
        moved = (p - start[n]).abs().max().item()
        assert moved > 0 and (p - theirs[n]).abs().max().item() <= 0.05 * moved + 1e-6, n


def test_a_text_batch_no_graph_takes_runs_eagerly_and_a_captured_one_replays(monkeypatch):
    bodies = []
    step = SimpleNamespace(hooks=SimpleNamespace(loss=None, mark=lambda name: None), advance=lambda m: None,
                           body=lambda batches, rows=None: bodies.append(rows) or {"loss": torch.zeros(())})
    graphed = GraphedStep.__new__(GraphedStep)
    graphed.step, graphed.fresh, graphed.graphs, graphed.eager_fallbacks = step, False, {}, 0
    graphed.trained, graphed.audio, graphed.plain_audio = None, None, None
    graphed([SimpleNamespace(input_ids=torch.zeros(1, 16, dtype=torch.long), layout="padded")])
    assert bodies == [None] and graphed.eager_fallbacks == 1
    replays = []
    graphed.graphs[16] = SimpleNamespace(batch=None, audio=None, graph=SimpleNamespace(replay=lambda: replays.append(1)),
                                         out={"loss": torch.ones(())})
    monkeypatch.setattr("brisk.speed.graph._copy_into", lambda dst, src: None)
    out = graphed([SimpleNamespace(input_ids=torch.zeros(1, 16, dtype=torch.long), layout="packed")])
    assert replays == [1] and float(out["loss"]) == 1.0 and len(bodies) == 1


# ------------------------------------------------------------------ Gated DeltaNet: rows aligned to fla's chunks
def _hybrid(tmp_path, *extra):
    return chat_cfg([f"train.output_dir={tmp_path / 'run'}", "data.num_workers=0", *QWEN3_5, *GRAPH,
                     "speed.fla_kernels=true", "speed.pack_buckets=[1024,2048,4096]", *extra])


def test_a_hybrid_models_static_rows_align_each_conversation_to_fla_chunks(tmp_path, samples):  # noqa: F811
    """Under the graph a Gated DeltaNet model's packed conversations start at multiples of 64 (label-free padding,
    positions counting on), so its chunk count is the row length / 64 for any batch of a bucket; the batch carries
    fla's chunk indices, made on the host; a full-attention model's rows stay back to back."""
    from brisk.data.collate import pad_static
    from brisk.plan import chunk_align

    cfg = _hybrid(tmp_path)
    collate = collator_for(cfg)
    assert collate.align == chunk_align(cfg) == 64 and chunk_align(_cfg(tmp_path, *GRAPH)) == 0
    assert chunk_align(_hybrid(tmp_path, "speed.cuda_graph=false")) == 0
    plain = Collator(packed=True, token_buckets=(1024, 2048, 4096))(samples[:4])
    for group in (samples[:4], samples[2:5]):
        b = collate(group)
        t = b.input_ids.shape[1]
        cu = b.cu_seqlens.tolist()
        assert t % 64 == 0 and all(c % 64 == 0 for c in cu) and b.chunk_indices.shape == (t // 64, 2)
        starts = torch.arange(0, t, 64)
        seq = (starts[:, None] >= torch.tensor(cu)[None, 1:]).sum(1)  # a chunk's sequence: boundaries at or before it
        within = (starts - torch.tensor(cu)[seq]) // 64
        assert torch.equal(b.chunk_indices, torch.stack([seq, within], 1))
        assert b.n_tokens == sum(len(x.tokens.input_ids) for x in group)
    b = collate(samples[:4])
    assert int((b.labels != -100).sum()) == int((plain.labels != -100).sum())  # the padding carries no label
    wide = pad_static(b, b.input_ids.shape[1] + 1024, 0, 0, b.cu_seqlens.numel())  # several ranks: a longer row
    assert wide.chunk_indices.shape == (wide.input_ids.shape[1] // 64, 2) and wide.chunk_indices[-1, 0] == b.n_utts
    end = int(b.cu_seqlens[b.n_utts])  # the real sequences (with their aligned padding) keep their positions
    assert end > b.n_tokens and torch.equal(wide.position_ids[:, :end], b.position_ids[:, :end])
    assert torch.equal(wide.position_ids[0, end:], torch.arange(wide.input_ids.shape[1] - end))  # the tail's own


def test_graph_examples_give_each_bucket_its_static_batch(tmp_path):
    """The chat family's examples for capturing every bucket before training (speed.graph_capture=ahead): one batch
    of each bucket's exact length up to the limit, in the static layout, aligned for the hybrid."""
    for cfg in (_cfg(tmp_path, *GRAPH, "speed.pack_buckets=[512,1024,2048]"), _hybrid(tmp_path)):
        collate = collator_for(cfg)
        batches = family_of(cfg).graph_examples(cfg, collate, 392, 2048)
        assert [b.input_ids.shape[1] for b in batches] == [t for t in cfg.speed.pack_buckets if t <= 2048]
        for b in batches:
            t = b.input_ids.shape[1]
            assert b.layout == "packed" and b.cu_seqlens.numel() == cfg.data.max_utts + 2 and b.labels[0, 0] == -100
            assert int((b.labels != -100).sum()) > 0
            assert (b.chunk_indices is not None) == bool(collate.align)
            if collate.align:
                assert b.chunk_indices.shape == (t // 64, 2)
    with pytest.raises(ConfigError, match="every bucket must be one too .not 1000, 2000."):
        _hybrid(tmp_path, "speed.pack_buckets=[1000,2000,4096]")


def test_the_sampler_counts_each_conversations_aligned_span(tmp_path):
    from brisk.data.loader import build_split

    cfg = _hybrid(tmp_path)
    split = build_split(cfg, "train", collator_for(cfg), 392)
    plain = build_split(_hybrid(tmp_path, "speed.cuda_graph=false"), "train", Collator(packed=True), 392)
    assert (split.sampler.lengths % 64 == 0).all()
    assert (split.sampler.lengths >= plain.sampler.lengths).all() and (split.sampler.lengths - plain.sampler.lengths < 64).all()


@pytest.mark.parametrize("fla", [False, True])
def test_an_aligned_row_gives_the_plain_packed_loss_and_gradients(tmp_path, samples, monkeypatch, fla):  # noqa: F811
    """Qwen3.5 on the aligned static row against the plain packed row: the same loss, count and gradients, with
    the per-sequence torch path or (fla) fla's two entry points as brisk calls them (fake_fla: torch's reference
    per sequence), which then get the batch's chunk indices and no host copy of cu_seqlens."""
    from brisk.models.build import build_model
    from brisk.speed.llm_kernels import apply_fla_linear_attention, apply_linear_attention_per_sequence

    from .test_chat_model import fake_fla, loss_and_grads

    calls = fake_fla(monkeypatch) if fla else []
    cfg = _hybrid(tmp_path)
    model = build_model(chat_cfg(QWEN3_5))
    (apply_fla_linear_attention if fla else apply_linear_attention_per_sequence)(model)
    aligned = collator_for(cfg)(samples[:4])
    plain = Collator(packed=True, token_buckets=(1024, 2048, 4096))(samples[:4])
    l0, g0, c0 = loss_and_grads(model, plain)
    n = len(calls)
    l1, g1, c1 = loss_and_grads(model, aligned)
    assert int(c0) == int(c1) > 0
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-6, msg=k)
    if fla:
        assert calls[n:] and all(c[3] is aligned.chunk_indices and c[2] is None for c in calls[n:])
        assert all(c[1].dtype == torch.int64 for c in calls[n:])
