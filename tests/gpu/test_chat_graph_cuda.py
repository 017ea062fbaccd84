"""The chat family's graphed step on CUDA (skipped without CUDA): a tiny Qwen3 and a tiny Qwen3.5 (bf16; its Gated
DeltaNet layers through fla, each conversation aligned to fla's 64-token chunks and the chunk indices given) on
the bundled chat data, packed in the static layout, each bucket's whole step (forward, backward, fused AdamW)
captured at its first batch and replayed. Graphed == eager losses and parameters over 8 steps (persistent and
fresh gradients, with label_head), the compiled layers without a recompile, and no host sync in a replayed step.

    python -m pytest tests/gpu/test_chat_graph_cuda.py -q      # on the GPU machine
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
BASE = ["speed.packing=true", "speed.fused_adamw=true", "speed.pack_buckets=[512,1024,2048]"]
MODELS = {"qwen3": ["model.llm.config.num_hidden_layers=2"],
          # the Gated DeltaNet widths fla is checked at on Hopper (K = 128)
          "qwen3_5": ["model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 256, "
                      "intermediate_size: 512, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, "
                      "head_dim: 64, linear_num_key_heads: 2, linear_num_value_heads: 4, linear_key_head_dim: 128, "
                      "linear_value_head_dim: 64, linear_conv_kernel_dim: 4, tie_word_embeddings: false, "
                      "layer_types: [linear_attention, full_attention, linear_attention, full_attention]}",
                      "speed.fla_kernels=true"]}


def _model(arch: str) -> list[str]:
    if arch == "qwen3_5":
        from .test_llm_kernels_cuda import needs_fla

        needs_fla()
    return MODELS[arch]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-12)).item()


def _run_steps(tmp_path, extra: list[str], n: int = 8, arch: str = "qwen3", groups: list | None = None):
    """``groups``: the sample groups to step through (the other arm's: the hybrid's graphed arm groups by aligned
    spans); None: this config's first n."""
    from brisk.bench.harness import build_runner, sample_stream, sync
    from brisk.config import load_config

    cfg = load_config(ROOT / "configs" / "sft_demo.yaml",
                      [f"train.output_dir={tmp_path}", "train.device=cuda", "data.num_workers=0",
                       "model.llm.dtype=bf16", "optim.warmup_steps=4", f"speed.inductor_cache_dir={tmp_path.parent / 'ind'}",
                       *_model(arch), *BASE, *extra])
    runner = build_runner(cfg)
    groups = groups if groups is not None else sample_stream(runner.cfg, n, 400)
    runner.groups = groups
    losses = [float(runner.run(runner.collate(g))["loss"]) for g in groups]
    sync(runner.device)
    params = {k: v.detach().float().cpu() for k, v in runner.model.named_parameters() if v.requires_grad}
    return losses, params, runner


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("extra", [[], ["speed.fresh_grads=true"], ["speed.label_head=true"]])
def test_the_graphed_chat_step_equals_the_eager_step_over_8_steps(tmp_path, extra, arch):
    """The same sample groups in both arms (the graphed hybrid's sampler counts aligned spans): the eager arm packs
    them back to back, the graphed one aligns each conversation to fla's chunks (the same loss by causality)."""
    lb, pb, runner = _run_steps(tmp_path / "b", ["speed.cuda_graph=true", *extra], arch=arch)
    la, pa, _ = _run_steps(tmp_path / "a", [e for e in extra if "fresh" not in e], arch=arch, groups=runner.groups)
    step = runner.step
    assert type(step).__name__ == "GraphedStep" and any(c is not None for c in step.graphs.values())
    assert step.eager_fallbacks == 0 and not step.encoder.graphs
    if arch == "qwen3_5":
        assert runner.parts.collator.align == 64
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3, list(zip(la, lb))
    worst = max(pa, key=lambda k: _rel(pa[k], pb[k]))
    assert _rel(pa[worst], pb[worst]) < 1e-2, worst
    assert len(set(la)) > 1


def test_the_graphed_compiled_chat_step_keeps_its_eager_twins_losses_without_a_recompile(tmp_path):
    from brisk.speed.compile import compile_counters

    fast = ["speed.compile=true", "speed.compile_dynamic=false", "speed.label_head=true"]
    torch._dynamo.reset()
    la, pa, _ = _run_steps(tmp_path / "a", fast + ["speed.compile_dynamic=true"])
    torch._dynamo.reset()
    lb, pb, runner = _run_steps(tmp_path / "b", fast + ["speed.cuda_graph=true", "speed.fresh_grads=true"])
    before = compile_counters().get("recompiles", 0)
    from brisk.bench.harness import sample_stream

    for g in sample_stream(runner.cfg, 8, 400):  # the same buckets again: replays only
        runner.run(runner.collate(g))
    assert compile_counters().get("recompiles", 0) == before
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 2e-2, list(zip(la, lb))
    assert max(_rel(pa[k], pb[k]) for k in pa) < 2e-2


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_replayed_chat_step_does_not_sync_with_the_host(tmp_path, arch):
    from .test_qwen3_asr_graph_cuda import steps_without_sync

    _, _, runner = _run_steps(tmp_path, ["speed.cuda_graph=true", "speed.label_head=true"], n=4, arch=arch)
    steps_without_sync(runner, runner.groups)  # the buckets the 4 steps captured
