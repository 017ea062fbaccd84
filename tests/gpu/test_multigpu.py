"""Two GPUs (skipped with fewer): the graphed fast path under torchrun against one GPU accumulating the same
two batches, and eager DDP (NCCL) the same way.

    python -m pytest tests/gpu/test_multigpu.py -q        # on a machine with 2+ GPUs

Why one GPU with train.accum_grad=2 is the reference: rank r trains on batches r, r + 2, ... (round-robin
dealing; data.sort_size covers the whole profile, so both runs sort it as one chunk); the ranks' averaged
gradient, grad((L_a + L_b) / 2), is what one process accumulating L_a / 2 and L_b / 2 computes. The graph
cannot accumulate, so the reference is the eager step with the same fused AdamW. fp32 LLM, dropout off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "data.profile=brisk/bench/profiles/aishell1_like.jsonl", "data.train=null", "data.valid=null", "data.num_workers=0",
    "data.sort_size=4000", "data.shuffle=false",
    "fun_asr_nano.encoder.output_size=128", "fun_asr_nano.encoder.linear_units=256", "fun_asr_nano.encoder.num_blocks=4", "fun_asr_nano.encoder.tp_blocks=2",
    "fun_asr_nano.encoder.dropout_rate=0.0", "model.encoder.freeze=true", "model.adaptor.freeze=true", "fun_asr_nano.adaptor.ffn_dim=256",
    "model.llm.dtype=fp32", "model.llm.config.vocab_size=4096", "model.llm.config.hidden_size=256",
    "model.llm.config.intermediate_size=768", "model.llm.config.num_hidden_layers=4", "model.llm.config.num_attention_heads=4",
    "model.llm.config.num_key_value_heads=2", "model.llm.config.head_dim=64", "model.llm.config.bos_token_id=null",
    "model.llm.config.eos_token_id=null", "train.device=cuda", "optim.warmup_steps=2", "optim.lr=1e-3",
    "train.max_steps=6", "probe.enabled=true", "probe.param_norm_steps=[1,2,3,4,5,6]", "train.progress=false",
    "train.tensorboard=false", "train.export=none", "diagnose.report=false", "train.log_every=1",
]
FAST = ["speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true"]
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _train(out: Path, overrides: list[str], nproc: int) -> None:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)] if nproc > 1 else [sys.executable]
    cmd = [*launcher, "-m", "brisk", "train", str(REPO / "configs/fun_asr_nano.yaml"), *SMALL, *overrides,
           f"train.output_dir={out}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=500, cwd=REPO, env={**os.environ, **ENV})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]


def _probe(path: Path) -> dict:
    from brisk.probe.compare import load_record

    return load_record(path)


def _params(run: Path) -> dict:
    ckpt = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
    from brisk.models.build import read_checkpoint

    return read_checkpoint(ckpt)["state_dict"]


@pytest.mark.parametrize("graph", [False, True], ids=["eager_ddp", "cuda_graph"])
def test_two_gpus_equal_one_gpu_accumulating(tmp_path, graph):
    two, one = tmp_path / "two", tmp_path / "one"
    _train(two, FAST + (["speed.cuda_graph=true"] if graph else []), 2)  # train.device=cuda: each rank its own GPU
    _train(one, FAST + ["train.accum_grad=2"], 1)
    r0, r1, ref = _probe(two / "probe.rank0.jsonl"), _probe(two / "probe.rank1.jsonl"), _probe(one / "probe.rank0.jsonl")
    steps = range(1, 7)
    assert any(r0[("batch.tokens", s)] != r1[("batch.tokens", s)] for s in steps)  # the ranks saw different data
    for s in steps:
        mean = (r0[("loss", s)] + r1[("loss", s)]) / 2
        assert abs(ref[("loss", s)] - mean) <= 1e-4 * ref[("loss", s)], (s, ref[("loss", s)], mean)
        for r in (r0, r1):
            assert abs(r[("grad_norm", s)] - ref[("grad_norm", s)]) <= 1e-3 * ref[("grad_norm", s)], s
            assert abs(r[("param_norm", s)] - ref[("param_norm", s)]) <= 1e-5 * ref[("param_norm", s)], s
        # The ranks hold the same parameters (NCCL gives every rank the same sum).
        assert abs(r0[("param_norm", s)] - r1[("param_norm", s)]) <= 1e-7 * r0[("param_norm", s)]
    pa, pb = _params(two), _params(one)
    worst = max(float((pa[k].float() - pb[k].float()).norm() / pb[k].float().norm().clamp_min(1e-12)) for k in pa)
    assert worst <= 1e-3, worst  # relative L2 per tensor (bench/gpu_checks.py measured 4e-3 for graph vs eager in bf16)
    assert (two / "steps.rank1.jsonl").exists()


def test_fsdp_equals_ddp_on_two_gpus(tmp_path):
    """FSDP2 (NCCL reduce-scatter) against DDP (NCCL all-reduce), same batches, bf16 decoder as in the recipe."""
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    bf16 = ["model.llm.dtype=bf16", "speed.frozen_eval=true"]
    _train(ddp, bf16, 2)
    _train(fsdp, bf16 + ["train.parallel=fsdp"], 2)
    for r in (0, 1):
        a, b = _probe(ddp / f"probe.rank{r}.jsonl"), _probe(fsdp / f"probe.rank{r}.jsonl")
        for s in range(1, 7):
            assert abs(a[("loss", s)] - b[("loss", s)]) <= 1e-2 * a[("loss", s)], (r, s)  # bf16: 1%
            assert abs(a[("grad_norm", s)] - b[("grad_norm", s)]) <= 2e-2 * a[("grad_norm", s)], (r, s)
    pa, pb = _params(ddp), _params(fsdp)
    assert list(pa) == list(pb) and all(pa[k].shape == pb[k].shape and pa[k].dtype == pb[k].dtype for k in pa)
    worst = max(float((pa[k].float() - pb[k].float()).norm() / pa[k].float().norm().clamp_min(1e-12)) for k in pa)
    assert worst <= 1e-2, worst
    assert "FSDP2 over 2 ranks" in (fsdp / "train.log").read_text()
