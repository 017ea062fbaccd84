"""CUDA-only checks of brisk's fast paths, run on the GPU machine (CI has no GPU).

    python bench/gpu_checks.py [--out DIR]

1. varlen attention (FlashAttention varlen) against per-sequence causal SDPA, bf16, forward and backward.
2. packed (varlen) loss against padded loss on CUDA, fp32 LLM.
3. the CUDA-graph step against the same step run eagerly: losses step by step and parameters after 8 steps.
4. speed.compile per layer: how many graphs Dynamo compiled for N identical decoder layers, and that the
   compiled step matches eager.
5. every switch leaves torch's backend flags as they were once the run is over.
Prints a table and writes gpu_checks.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brisk.bench.harness import build_runner, sample_stream, sync  # noqa: E402
from brisk.config import load_config  # noqa: E402
from brisk.data.collate import Collator  # noqa: E402
from brisk.models.build import build_model  # noqa: E402
from brisk.models.speech_llm import lm_loss  # noqa: E402
from brisk.speed.compile import compile_counters  # noqa: E402
from brisk.speed.flags import backend_flags  # noqa: E402
from brisk.speed.varlen import varlen_attention  # noqa: E402

SMALL = [  # a small speech-LLM of the real layout: bf16 LLM trained, encoder and adaptor frozen
    "data.profile=brisk/bench/profiles/aishell1_like.jsonl", "data.train=null", "data.valid=null", "data.num_workers=0",
    "model.encoder.output_size=128", "model.encoder.linear_units=256", "model.encoder.num_blocks=4", "model.encoder.tp_blocks=2",
    "model.encoder.freeze=true", "model.adaptor.freeze=true", "model.adaptor.ffn_dim=256",
    "model.llm.dtype=bf16", "model.llm.config.vocab_size=4096", "model.llm.config.hidden_size=256",
    "model.llm.config.intermediate_size=768", "model.llm.config.num_hidden_layers=6", "model.llm.config.num_attention_heads=4",
    "model.llm.config.num_key_value_heads=2", "model.llm.config.head_dim=64", "train.device=cuda", "optim.warmup_steps=4",
    "optim.lr=1e-3", "model.llm.config.bos_token_id=null", "model.llm.config.eos_token_id=null",
]


def check_varlen() -> dict:
    torch.manual_seed(0)
    lens = [37, 120, 5, 64, 211]
    t = 512
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)) + [t], dtype=torch.int32, device="cuda")
    q = torch.randn(1, 16, t, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, _ = varlen_attention(None, q, k, v, None, scaling=128**-0.5, cu_seq_lens_q=cu)
    out.float().square().sum().backward()
    g = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    refs = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        r = torch.nn.functional.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True,
                                                             enable_gqa=True, scale=128**-0.5)
        refs.append(r[0].transpose(0, 1))
    ref = torch.cat(refs)
    ref.float().square().sum().backward()
    fwd = (out[0].float() - ref.float()).abs().max().item()
    bwd = max((a.float() - x.grad.float()).abs().max().item() / x.grad.float().abs().max().item() for a, x in zip(g, (q, k, v)))
    return {"varlen_fwd_max_abs": fwd, "varlen_bwd_max_rel": bwd, "ok": fwd < 0.02 and bwd < 0.02}


def check_packed_vs_padded() -> dict:
    cfg = load_config(REPO / "configs/fun_asr_nano.yaml", SMALL + ["model.llm.dtype=fp32", "speed.packing=true"])
    model = build_model(cfg.model, "cuda").eval()
    from brisk.speed import apply_speed

    apply_speed(model, cfg, torch.device("cuda"))  # installs the varlen attention for packed rows
    samples = sample_stream(cfg, 1, 4096)[0]
    padded = Collator()(samples).to("cuda")
    packed = Collator(packed=True, token_buckets=(512, 1024, 2048))(samples).to("cuda")
    model.llm.config._attn_implementation = "sdpa"
    with torch.no_grad():
        l1, _, _ = lm_loss(model(padded), padded.labels)
        model.llm.config._attn_implementation = "brisk_varlen"
        l2, _, _ = lm_loss(model(packed), packed.labels)
    rel = abs(l1.item() - l2.item()) / abs(l1.item())
    out = {"fp32_padded_loss": l1.item(), "fp32_packed_loss": l2.item(), "fp32_rel": rel}
    model.llm.to(torch.bfloat16)  # bf16 LLM: the packed row now takes FlashAttention varlen
    model.llm_dtype = torch.bfloat16
    with torch.no_grad():
        model.llm.config._attn_implementation = "sdpa"
        l1, _, _ = lm_loss(model(padded), padded.labels)
        model.llm.config._attn_implementation = "brisk_varlen"
        l2, _, _ = lm_loss(model(packed), packed.labels)
    rel16 = abs(l1.item() - l2.item()) / abs(l1.item())
    return {**out, "bf16_padded_loss": l1.item(), "bf16_packed_loss": l2.item(), "bf16_rel": rel16,
            "ok": rel < 1e-4 and rel16 < 1e-2}


def run_steps(overrides: list[str], n: int) -> tuple[list[float], dict, dict, float]:
    cfg = load_config(REPO / "configs/fun_asr_nano.yaml", SMALL + overrides)
    before = backend_flags()
    t0 = time.perf_counter()
    runner = build_runner(cfg)
    stream = sample_stream(cfg, n, 4096)
    losses = []
    for samples in stream:
        m = runner.run(runner.collate(samples))
        losses.append(m["loss"])
    sync(runner.device)
    elapsed = time.perf_counter() - t0
    losses = [float(x) for x in losses]
    params = {k: v.detach().float().cpu() for k, v in runner.model.named_parameters() if v.requires_grad}
    return losses, params, {"flags_unchanged": backend_flags() == before}, elapsed


def compare(a, b) -> dict:
    la, pa = a[0], a[1]
    lb, pb = b[0], b[1]
    loss_rel = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    prel = max(((pa[k] - pb[k]).norm() / pa[k].norm().clamp_min(1e-12)).item() for k in pa)
    return {"loss_max_rel": loss_rel, "param_max_rel_l2": prel}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/tmp")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    results["varlen"] = check_varlen()
    results["packed_vs_padded"] = check_packed_vs_padded()
    base = ["speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true"]
    eager = run_steps(base, 8)
    graphed = run_steps(base + ["speed.cuda_graph=true"], 8)
    results["graph_vs_eager"] = {**compare(eager, graphed), **graphed[2], "eager_losses": eager[0], "graph_losses": graphed[0]}
    c0 = compile_counters()
    compiled = run_steps(base + ["speed.cuda_graph=true", "speed.compile=true"], 8)
    c1 = compile_counters()
    results["compile_graph_vs_eager"] = {**compare(eager, compiled), **compiled[2], "graphs_compiled": c1["graphs"] - c0["graphs"],
                                         "layers": 6, "seconds": compiled[3]}
    padded = run_steps([], 4)
    results["defaults_flags"] = padded[2]
    sdpa = run_steps(["speed.sdpa_backends=[flash,efficient,math]", "speed.tf32=true"], 4)
    results["sdpa_tf32_flags"] = sdpa[2]
    (out / "gpu_checks.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
