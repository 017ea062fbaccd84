"""speed.label_head on CUDA (skipped without it): the graphed fast path with and without the switch, and the
eager CUDA gradients against the default head.

    python -m pytest tests/gpu -q        # on the GPU machine
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REPO = Path(__file__).resolve().parents[2]
BASE = ["speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true", "speed.cuda_graph=true"]


@pytest.fixture(scope="module")
def checks():
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_checks

    return gpu_checks


def test_graphed_step_with_label_head_matches_the_default_head(checks):
    ref = checks.run_steps(BASE, 8)
    lab = checks.run_steps(BASE + ["speed.label_head=true"], 8)
    cmp = checks.compare(ref, lab)
    # bf16 LLM: the head's GEMM over fewer rows may round differently; 8 steps of AdamW keep it small.
    assert cmp["loss_max_rel"] < 1e-2, cmp
    assert cmp["param_max_rel_l2"] < 1e-2, cmp
    assert lab[2]["flags_unchanged"]


def test_graphs_are_keyed_by_gathered_rows_and_overflow_gets_its_own(checks):
    from brisk.bench.harness import build_runner, sample_stream
    from brisk.config import load_config

    cfg = load_config(REPO / "configs/fun_asr_nano.yaml", checks.SMALL + BASE + ["speed.label_head=true",
                                                                                 "speed.label_rows_frac=0.02"])
    from brisk.speed.label_head import static_rows

    runner = build_runner(cfg)
    overflowed = 0
    for samples in sample_stream(cfg, 24, 4096):  # enough batches that some carry more than 64 labels
        batch = runner.collate(samples)
        runner.run(batch)
        t, k = batch.input_ids.shape[1], static_rows(batch.input_ids.shape[1], 0.02)
        # 2% of a bucket (64 rows) is fewer than a batch's labelled positions: that batch takes an all-rows graph.
        overflowed += batch.n_label_tokens > k
        assert ((t, t) if batch.n_label_tokens > k else (t, k)) in runner.step.graphs
    assert overflowed, "no batch had more than 64 labelled positions; the overflow path went untested"
    assert all(isinstance(k, tuple) for k in runner.step.graphs)


def test_eager_cuda_gradients_match(checks):
    from brisk.config import load_config
    from brisk.data.collate import Collator
    from brisk.models.build import build_model
    from brisk.bench.harness import sample_stream
    from brisk.speed.label_head import LabelHead
    from brisk.train.step import StepHooks, model_loss

    cfg = load_config(REPO / "configs/fun_asr_nano.yaml", checks.SMALL + ["model.llm.dtype=fp32"])
    model = build_model(cfg, torch.device("cuda")).eval()
    batch = Collator(packed=True, token_buckets=(512, 1024, 2048))(sample_stream(cfg, 1, 4096)[0]).to("cuda")
    out = []
    for hook in (None, LabelHead()):
        model.zero_grad(set_to_none=True)
        _, loss, correct, count = model_loss(model, batch, StepHooks(loss=hook))
        loss.backward()
        out.append((loss.item(), int(correct), int(count),
                    {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (l0, c0, n0, g0), (l1, c1, n1, g1) = out
    assert abs(l0 - l1) <= 1e-5 * abs(l0) and (c0, n0) == (c1, n1)
    for n, g in g0.items():  # fp32 on CUDA: TF32 is off by default, so only summation order differs
        assert (g1[n] - g).norm() <= 1e-4 * g.norm().clamp_min(1e-12), n


def test_fresh_grads_give_the_persistent_buffers_numbers(checks):
    """speed.fresh_grads: backward writes new gradients instead of adding into zeroed buffers; 0 + g == g, so the
    run is bit-identical (losses and parameters; the probe's gradient norms: the next test)."""
    ref = checks.run_steps(BASE, 8)
    fresh = checks.run_steps(BASE + ["speed.fresh_grads=true"], 8)
    assert fresh[0] == ref[0], (fresh[0], ref[0])
    assert all(torch.equal(fresh[1][k], ref[1][k]) for k in ref[1])


def _probe_grad_norms(run_dir) -> dict:
    import json

    rows = [json.loads(x) for x in (run_dir / "probe.rank0.jsonl").read_text().splitlines()[1:]]
    return {(r["step"], r["metric"]): r["value"] for r in rows if r["metric"].startswith("grad_norm")}


def test_fresh_grads_give_the_probe_the_same_gradient_norms(checks, tmp_path):
    """The probe's per-module gradient norms are taken inside the graphed body (StepHooks.grad_groups), from the
    gradients that replay wrote: the same numbers with fresh gradients as with the persistent buffers."""
    from brisk.config import load_config
    from brisk.train.run import train

    run = ["train.progress=false", "train.tensorboard=false", "train.log_every=1", "diagnose.report=false",
           "train.export=none", "train.max_steps=4", "train.save_final=false", "probe.enabled=true",
           "probe.param_norm_steps=[1,2,3,4]"]
    norms = {}
    for fresh in (False, True):
        out = tmp_path / f"fresh_{fresh}"
        train(load_config(REPO / "configs/fun_asr_nano.yaml", checks.SMALL + BASE + run + [
            f"speed.fresh_grads={str(fresh).lower()}", f"train.output_dir={out}"]))
        norms[fresh] = _probe_grad_norms(out)
    # Equal up to run-to-run noise: FlashAttention's backward accumulates dq with atomics, so even two runs of
    # the same configuration differ in the last bits (seen: 1.5066576 vs 1.5066575 on one module, one run of three).
    assert norms[True].keys() == norms[False].keys() and {s for s, _ in norms[True]} == {1, 2, 3, 4}
    assert all(abs(norms[True][k] - norms[False][k]) <= 1e-5 * abs(norms[False][k]) for k in norms[False])
    assert sum(m != "grad_norm" for _, m in norms[True]) > 4  # per-module norms, not only the total


def test_fresh_grads_with_a_trainable_parameter_without_gradient(checks, tmp_path):
    """A trainable CTC branch is not in the loss: its parameters get no gradient. With fresh gradients they have
    none (as in the eager step) and the probe's per-group norms still capture (no host copy inside the graph)."""
    from brisk.config import load_config
    from brisk.train.run import train

    ctc = ["fun_asr_nano.ctc.enabled=true", "fun_asr_nano.ctc.freeze=false", "fun_asr_nano.ctc.n_layer=1", "fun_asr_nano.ctc.dim=128",
           "fun_asr_nano.ctc.ffn_dim=256", "fun_asr_nano.ctc.vocab_size=100"]
    run = ["train.progress=false", "train.tensorboard=false", "train.log_every=1", "diagnose.report=false",
           "train.export=none", "train.max_steps=3", "train.save_final=false", "probe.enabled=true",
           "probe.param_norm_steps=[1,2,3]", f"train.output_dir={tmp_path}"]
    train(load_config(REPO / "configs/fun_asr_nano.yaml", checks.SMALL + BASE + ctc + run + ["speed.fresh_grads=true"]))
    norms = _probe_grad_norms(tmp_path)
    assert {s for s, _ in norms} == {1, 2, 3} and all(v == v and v >= 0 for v in norms.values())
    assert any(v > 0 for (s, m), v in norms.items() if m == "grad_norm")
