"""Qwen3-ASR's graphed step on CUDA (skipped without CUDA): the tiny demo model (bf16 decoder trained, audio tower
and projector frozen), each packed bucket's step captured up front and replayed; the frozen tower running
eagerly before each replay, or, under speed.audio_varlen, replaying a graph of its own per bucket
(GraphedAudioInputs). As tests/gpu/test_gpu_state.py checks Fun-ASR-Nano's: graphed == eager losses and
parameters over 8 steps (eager tower, graphed tower), fresh gradients == persistent ones, the preset with its
compiled layers without a recompile, and no host sync in a replayed step. Then the same with every weight
training (the official recipe's work): the tower and projector inside the step graph.

    python -m pytest tests/gpu/test_qwen3_asr_graph_cuda.py -q      # on the GPU machine (transformers >= 5.24)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
BASE = ["speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-12)).item()


def _runner(tmp_path, extra: list[str]):
    from brisk.bench.harness import build_runner
    from brisk.config import load_config

    cfg = load_config(ROOT / "configs" / "qwen3_asr_demo.yaml",
                      [f"train.output_dir={tmp_path}", "train.device=cuda", "data.num_workers=0",
                       "model.encoder.freeze=true", "model.adaptor.freeze=true", "model.llm.dtype=bf16",
                       "optim.warmup_steps=4", f"speed.inductor_cache_dir={tmp_path.parent / 'ind'}", *extra])
    return build_runner(cfg)


def _run_steps(tmp_path, extra: list[str], n: int = 8):
    from brisk.bench.harness import sample_stream, sync

    runner = _runner(tmp_path, extra)
    losses = [float(runner.run(runner.collate(g))["loss"]) for g in sample_stream(runner.cfg, n, 400)]
    sync(runner.device)
    params = {k: v.detach().float().cpu() for k, v in runner.model.named_parameters() if v.requires_grad}
    return losses, params, runner


def test_graph_step_equals_eager_step_over_8_steps(tmp_path):
    la, pa, _ = _run_steps(tmp_path / "a", BASE)
    lb, pb, runner = _run_steps(tmp_path / "b", BASE + ["speed.cuda_graph=true"])
    step = runner.step
    assert type(step).__name__ == "GraphedStep" and step.graphs and not step.encoder.graphs  # the tower: eager
    assert step.eager_fallbacks == 0
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3, list(zip(la, lb))
    assert pa.keys() == pb.keys() and all(k.startswith("llm.") for k in pa)
    assert max(_rel(pa[k], pb[k]) for k in pa) < 1e-2
    assert len(set(la)) > 1  # the steps did train


def test_the_graphed_tower_step_equals_the_eager_step_over_8_steps(tmp_path):
    """speed.audio_varlen (fp32 tower: one masked SDPA call a layer): the tower in a graph per bucket, from its
    own padded inputs, and the step graph after it, against the same switches without the graphs."""
    la, pa, _ = _run_steps(tmp_path / "a", BASE + ["speed.audio_varlen=true"])
    lb, pb, runner = _run_steps(tmp_path / "b", BASE + ["speed.audio_varlen=true", "speed.cuda_graph=true"])
    step = runner.step
    assert type(step.encoder).__name__ == "GraphedAudioInputs" and step.encoder.graphs and step.graphs
    assert {k[0] for k in step.encoder.graphs} == set(step.graphs) and step.eager_fallbacks == 0  # one a bucket
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3, list(zip(la, lb))
    assert max(_rel(pa[k], pb[k]) for k in pa) < 1e-2
    assert len(set(la)) > 1


def test_fresh_gradients_train_like_persistent_ones(tmp_path):
    la, pa, _ = _run_steps(tmp_path / "a", BASE + ["speed.cuda_graph=true"])
    lb, pb, _ = _run_steps(tmp_path / "b", BASE + ["speed.cuda_graph=true", "speed.fresh_grads=true"])
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3
    assert max(_rel(pa[k], pb[k]) for k in pa) < 1e-2


def test_the_preset_is_graphed_compiles_once_and_keeps_the_losses_of_its_eager_twin(tmp_path):
    """speed.preset=fast (compiled decoder and tower layers, bf16 tower, label_head, fused projections,
    audio_varlen, cuda_graph, fresh_grads) against the same preset without the graph, 8 steps; no recompile."""
    from brisk.speed.compile import compile_counters

    torch._dynamo.reset()
    la, pa, _ = _run_steps(tmp_path / "a", ["speed.preset=fast", "speed.cuda_graph=false", "speed.fresh_grads=false"])
    torch._dynamo.reset()
    before = compile_counters().get("recompiles", 0)
    lb, pb, runner = _run_steps(tmp_path / "b", ["speed.preset=fast"])
    assert {"cuda_graph", "fresh_grads", "compile", "audio_varlen", "label_head"} <= set(runner.parts.plan.on)
    assert len(runner.step.graphs) >= len([t for t in runner.cfg.speed.pack_buckets if t <= 4096])  # up front
    lengths = {k if isinstance(k, int) else k[0] for k in runner.step.graphs}  # label_head keys: (length, rows)
    assert {k[0] for k in runner.step.encoder.graphs} == lengths  # the bf16 tower too, a graph a bucket
    assert compile_counters().get("recompiles", 0) == before
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-2, list(zip(la, lb))
    assert max(_rel(pa[k], pb[k]) for k in pa) < 2e-2
    assert lb[-1] < lb[0]


def steps_without_sync(runner, groups: list) -> list[dict]:
    """The runner's steps on ``groups`` (each of a bucket that has its graphs already) under torch's sync debug
    mode "error", which raises on any synchronising call: the batches pinned and copied first, as the loader's."""
    from brisk.bench.harness import sync
    from brisk.speed.flags import run_scope

    batches = [runner.collate(g).pin_memory().to(runner.device, non_blocking=True) for g in groups]
    sync(runner.device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with run_scope(runner.cfg):
            out = [runner.step([b]) for b in batches]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(m["loss"]).item() for m in out)
    return out


def test_a_replayed_step_does_not_sync_with_the_host(tmp_path):
    """The tower's inputs are made without reading anything back (its windows come from the host's counts),
    then its graph and the step's replay."""
    from brisk.bench.harness import sample_stream

    runner = _runner(tmp_path, BASE + ["speed.cuda_graph=true", "speed.audio_varlen=true", "speed.encoder_dtype=bf16"])
    groups = sample_stream(runner.cfg, 3, 400)
    runner.run(runner.collate(groups[0]))  # a graph for this bucket exists now, whatever was prepared
    steps_without_sync(runner, groups[1:])
    assert runner.step.encoder.graphs  # the tower was graphed (audio_varlen)


# ------------------------------------------------------------------ every weight training (the recipe's work)
TRAIN = ["model.encoder.freeze=false", "model.adaptor.freeze=false", "speed.packing=true", "speed.fused_adamw=true",
         "speed.audio_varlen=true"]


@pytest.mark.parametrize("fresh", [False, True])
def test_the_graphed_step_with_the_tower_training_equals_the_eager_step_over_8_steps(tmp_path, fresh):
    """The tower and projector train inside the step graph (from the bucket's static inputs): graphed == eager
    losses and parameters, the tower's and projector's included, over 8 steps; one step graph a bucket, none of
    the frozen path's audio graphs, nothing run eagerly."""
    la, pa, _ = _run_steps(tmp_path / "a", TRAIN)
    lb, pb, runner = _run_steps(tmp_path / "b", TRAIN + ["speed.cuda_graph=true", f"speed.fresh_grads={str(fresh).lower()}"])
    step = runner.step
    assert type(step).__name__ == "GraphedStep" and step.trained is not None and step.graphs
    assert not step.encoder.graphs and step.eager_fallbacks == 0
    assert all(isinstance(k, tuple) and len(k[1]) == 2 for k in step.graphs)  # (length, (audio slots, chunks))
    assert {k[0] for k in step.graphs} == {k[0] for k in step.graphs if k[1][0] == k[0]}  # a slot a position
    assert any(k.startswith("audio_tower.") for k in pa) and any(k.startswith("multi_modal_projector.") for k in pa)
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3, list(zip(la, lb))
    worst = max(pa, key=lambda k: _rel(pa[k], pb[k]))
    assert _rel(pa[worst], pb[worst]) < 1e-2, worst
    assert len(set(la)) > 1


def test_the_preset_with_the_tower_training_is_graphed_and_keeps_its_eager_twins_losses(tmp_path):
    """speed.preset=fast as the demo config ships it (every weight trains): compiled decoder and tower blocks,
    the whole step one graph a bucket, against the same preset without the graph, 8 steps; no recompile."""
    from brisk.speed.compile import compile_counters

    torch._dynamo.reset()
    train = ["model.encoder.freeze=false", "model.adaptor.freeze=false"]
    la, pa, _ = _run_steps(tmp_path / "a", train + ["speed.preset=fast", "speed.cuda_graph=false",
                                                     "speed.fresh_grads=false"])
    torch._dynamo.reset()
    before = compile_counters().get("recompiles", 0)
    lb, pb, runner = _run_steps(tmp_path / "b", train + ["speed.preset=fast"])
    assert {"cuda_graph", "fresh_grads", "compile", "audio_varlen"} <= set(runner.parts.plan.on)
    assert runner.step.trained is not None and runner.step.eager_fallbacks == 0
    assert compile_counters().get("recompiles", 0) == before
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-2, list(zip(la, lb))
    assert max(_rel(pa[k], pb[k]) for k in pa) < 2e-2
    assert lb[-1] < lb[0]


def test_a_replayed_step_with_the_tower_training_does_not_sync_with_the_host(tmp_path):
    from brisk.bench.harness import sample_stream

    runner = _runner(tmp_path, TRAIN + ["speed.cuda_graph=true"])
    groups = sample_stream(runner.cfg, 3, 400)
    runner.run(runner.collate(groups[0]))
    steps_without_sync(runner, groups[1:])
    assert runner.step.trained is not None
