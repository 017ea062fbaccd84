"""CUDA-only checks of the fast path and the state around it (skipped without CUDA; run on the GPU machine):

    python -m pytest tests/gpu -q -m gpu

Small models of the real layout (bf16 LLM trained, encoder and adaptor frozen) on the AISHELL-1-like length
profile (random features: no audio or tokenizer needed). Each test asserts; none prints "ok".
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from brisk.models.build import read_checkpoint

from ..conftest import REPO, speed_parts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

NANO = REPO / "configs" / "fun_asr_nano.yaml"
SMALL = [  # a small speech-LLM of the real layout: bf16 LLM trained, encoder and adaptor frozen
    f"data.profile={REPO / 'brisk/bench/profiles/aishell1_like.jsonl'}", "data.train=null", "data.valid=null",
    "data.num_workers=0", "fun_asr_nano.encoder.output_size=128", "fun_asr_nano.encoder.linear_units=256", "fun_asr_nano.encoder.num_blocks=4",
    "fun_asr_nano.encoder.tp_blocks=2", "model.encoder.freeze=true", "model.adaptor.freeze=true", "fun_asr_nano.adaptor.ffn_dim=256",
    "model.llm.dtype=bf16", "model.llm.config.vocab_size=4096", "model.llm.config.hidden_size=256",
    "model.llm.config.intermediate_size=768", "model.llm.config.num_hidden_layers=6", "model.llm.config.num_attention_heads=4",
    "model.llm.config.num_key_value_heads=2", "model.llm.config.head_dim=64", "train.device=cuda", "optim.warmup_steps=4",
    "optim.lr=1e-3", "model.llm.config.bos_token_id=null", "model.llm.config.eos_token_id=null",
]
RUN = ["train.progress=false", "train.tensorboard=false", "train.log_every=1", "diagnose.report=false",
       "train.export=none"]
FAST = ["speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true", "speed.cuda_graph=true"]


def _cfg(*overrides):
    from brisk.config import load_config

    return load_config(NANO, SMALL + list(overrides))


def _ckpt(run_dir, step):
    return read_checkpoint(run_dir / "checkpoints" / f"ckpt-{step:08d}.pt")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-12)).item()


def _trainable(state: dict) -> list[str]:
    return [k for k in state if k.startswith("llm.") and state[k].is_floating_point()]


# ------------------------------------------------------------------------------------- kernels
def test_varlen_attention_matches_per_sequence_sdpa():
    from brisk.speed.varlen import varlen_attention

    torch.manual_seed(0)
    lens, t = [37, 120, 5, 64, 211], 512
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)) + [t], dtype=torch.int32, device="cuda")
    q = torch.randn(1, 16, t, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, _ = varlen_attention(None, q, k, v, None, scaling=128**-0.5, cu_seq_lens_q=cu)
    out.float().square().sum().backward()
    g = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    refs = [torch.nn.functional.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True,
                                                             enable_gqa=True, scale=128**-0.5)[0].transpose(0, 1)
            for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())]
    ref = torch.cat(refs)
    ref.float().square().sum().backward()
    assert (out[0].float() - ref.float()).abs().max().item() < 0.02
    for a, x in zip(g, (q, k, v)):
        assert (a.float() - x.grad.float()).abs().max().item() / x.grad.float().abs().max().item() < 0.02


def test_packed_loss_equals_padded_loss():
    from brisk.bench.harness import sample_stream
    from brisk.data.collate import Collator
    from brisk.models.build import build_model
    from brisk.models.lm import lm_loss
    cfg = _cfg("model.llm.dtype=fp32", "speed.packing=true")
    model = build_model(cfg, "cuda").eval()
    speed_parts(model, cfg, "cuda")  # installs the varlen attention for packed rows
    samples = sample_stream(cfg, 1, 4096)[0]
    padded = Collator()(samples).to("cuda")
    packed = Collator(packed=True, token_buckets=(512, 1024, 2048))(samples).to("cuda")
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
        model.llm.to(dtype)
        model.llm_dtype = dtype
        with torch.no_grad():
            model.llm.config._attn_implementation = "sdpa"
            l1, _, _ = lm_loss(model(padded), padded.labels)
            model.llm.config._attn_implementation = "brisk_varlen"
            l2, _, _ = lm_loss(model(packed), packed.labels)
        assert abs(l1.item() - l2.item()) / abs(l1.item()) < tol, dtype


# --------------------------------------------------------------------------- graph step == eager step
def _run_steps(overrides: list[str], n: int):
    from brisk.bench.harness import build_runner, sample_stream, sync
    from brisk.speed.flags import backend_flags

    cfg = _cfg(*overrides)
    before = backend_flags()
    runner = build_runner(cfg)
    losses = [float(runner.run(runner.collate(s))["loss"]) for s in sample_stream(cfg, n, 4096)]
    sync(runner.device)
    params = {k: v.detach().float().cpu() for k, v in runner.model.named_parameters() if v.requires_grad}
    assert backend_flags() == before  # no switch leaves a torch flag changed
    return losses, params


def test_graph_step_equals_eager_step_over_8_steps():
    base = ["speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true"]
    la, pa = _run_steps(base, 8)
    lb, pb = _run_steps(base + ["speed.cuda_graph=true"], 8)
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3
    assert max(_rel(pa[k], pb[k]) for k in pa) < 1e-2
    assert len(set(la)) > 1  # the steps did train


def test_the_graphed_step_with_the_encoder_training_equals_the_eager_step_over_8_steps():
    """The encoder and adaptor training inside the step graph (the speech padded to its buckets; no dropout, so
    both arms draw nothing random): graphed == eager losses and parameters, the encoder's included."""
    base = ["speed.packing=true", "speed.fused_adamw=true", "model.encoder.freeze=false", "model.adaptor.freeze=false",
            "fun_asr_nano.encoder.dropout_rate=0.0", "fun_asr_nano.frontend.dither=0.0"]
    la, pa = _run_steps(base, 8)
    lb, pb = _run_steps(base + ["speed.cuda_graph=true"], 8)
    assert any(k.startswith("audio_encoder.") for k in pa)
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3, list(zip(la, lb))
    worst = max(pa, key=lambda k: _rel(pa[k], pb[k]))
    assert _rel(pa[worst], pb[worst]) < 1e-2, worst
    assert len(set(la)) > 1


def test_fused_projections_train_like_the_plain_ones_on_the_fast_path():
    """speed.fuse_projections under the graphed, compiled step: the fused forwards are the ones compiled (as
    many graphs as without the switch: one decoder-layer graph still serves every layer), and the same losses
    and parameters (bf16 LLM: GEMM order only)."""
    from brisk.bench.harness import build_runner, sample_stream, sync
    from brisk.speed.compile import compile_counters

    base = ["speed.packing=true", "speed.frozen_eval=true", "speed.cuda_graph=true", "speed.compile=true"]
    out = []
    for extra in ([], ["speed.fuse_projections=true"]):
        torch._dynamo.reset()
        cfg = _cfg(*base, *extra)
        before = compile_counters().get("graphs", 0)
        runner = build_runner(cfg)
        losses = [float(runner.run(runner.collate(s))["loss"]) for s in sample_stream(cfg, 8, 4096)]
        sync(runner.device)
        params = {k: v.detach().float().cpu() for k, v in runner.model.named_parameters() if v.requires_grad}
        fused = type(runner.model.llm.model.layers[0].self_attn).__name__.startswith("Fused")  # the module swap
        out.append((losses, params, compile_counters().get("graphs", 0) - before, fused))
    (la, pa, ga, fa), (lb, pb, gb, fb) = out
    assert not fa and fb and ga == gb
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-2
    assert pa.keys() == pb.keys() and max(_rel(pa[k], pb[k]) for k in pa) < 1e-2


def test_release_frees_every_graph_and_a_later_step_captures_again():
    """GraphedStep.release (called before destroy_process_group under torchrun) resets every step and encoder
    graph and frees their pool; the object stays usable (a later step captures its graph again)."""
    from brisk.bench.harness import build_runner, sample_stream, sync

    cfg = _cfg("speed.packing=true", "speed.frozen_eval=true", "speed.fused_adamw=true", "speed.cuda_graph=true")
    runner = build_runner(cfg)
    stream = [runner.collate(s) for s in sample_stream(cfg, 3, 4096)]
    runner.run(stream[0])
    sync(runner.device)
    step = runner.step
    n = len(step.graphs) + len(step.encoder.graphs)
    assert n > 1 and step.release() == n
    assert not step.graphs and not step.encoder.graphs
    loss = float(runner.run(stream[1])["loss"])  # captured afresh, into a new pool
    assert loss == loss and len(step.graphs) == 1 and len(step.encoder.graphs) == 1


def test_seen_capture_captures_a_bucket_at_its_first_batch_and_trains_as_ahead():
    """speed.graph_capture=seen: nothing captured before the first step, then one step graph per bucket and one
    encoder graph per speech shape the batches reach, no more; the same losses and weights as capturing every
    bucket ahead (a bucket's first step runs the step body itself, warming the graph's kernels)."""
    from brisk.bench.harness import build_runner, sample_stream, sync

    out = {}
    for mode in ("ahead", "seen"):
        cfg = _cfg(*FAST, f"speed.graph_capture={mode}")
        runner = build_runner(cfg, graph_capture=None)  # the config's own (the harness captures ahead)
        before = sum(runner.step.captures.values())
        batches = runner.batches(sample_stream(cfg, 8, 4096))
        losses = [float(runner.run(b)["loss"]) for b in batches]
        sync(runner.device)
        params = {k: v.detach().float().cpu() for k, v in runner.model.named_parameters() if v.requires_grad}
        reached = len({b.input_ids.shape[1] for b in batches}) + len({tuple(b.speech.shape) for b in batches})
        out[mode] = (before, sum(runner.step.captures.values()), reached, losses, params)
    (a0, a1, _, la, pa), (s0, s1, reached, lb, pb) = out["ahead"], out["seen"]
    assert s0 == 0 and s1 == reached and a0 == a1 > s1  # ahead: every bucket before the first step, none after
    assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) < 1e-3
    assert max(_rel(pa[k], pb[k]) for k in pa) < 1e-2 and len(set(la)) > 1


def test_validation_replays_audio_graphs_but_captures_none():
    """Under seen, validation can meet a speech shape before training does. It computes that shape's rows
    eagerly (its forwards run compiled blocks eagerly: a graph captured there would hold eager kernels for every
    later training step of the shape); the next training step of the shape captures the graph."""
    from brisk.bench.harness import build_runner, sample_stream

    cfg = _cfg(*FAST, "speed.graph_capture=seen")
    runner = build_runner(cfg, graph_capture=None)
    step = runner.step
    batch = runner.batches(sample_stream(cfg, 1, 4096))[0].to(runner.device)
    with step.no_new_audio_graphs():
        rows = step.audio(batch)
    assert step.captures == {"step_captures": 0, "audio_captures": 0} and step.encoder.capture_new
    assert torch.allclose(rows.float(), step.plain_audio(batch).float(), rtol=1e-2, atol=1e-2)
    runner.run(batch)
    assert step.captures == {"step_captures": 1, "audio_captures": 1}
    with step.no_new_audio_graphs():  # a shape with a graph replays it
        again = step.audio(batch)
    assert torch.equal(again, step.audio(batch)) and step.captures["audio_captures"] == 1


def test_compiled_decoder_one_graph_for_all_layers_and_lengths_and_none_in_validation():
    """speed.compile on the real path: nn.Module.compile of every decoder layer gives one graph for all layers and
    for a second length (the first layer's view input made fresh by the stack's pre-hook), and the eval context
    (validation, decoding) compiles nothing."""
    from brisk.models.build import build_model
    from brisk.speed.compile import compile_counters

    torch._dynamo.reset()
    cfg = _cfg("speed.compile=true", "speed.compile_encoder=false", "speed.compile_on_error=raise")
    model = build_model(cfg, "cuda").train()
    _, _, parts = speed_parts(model, cfg, "cuda")
    g0 = compile_counters()["graphs"]
    for t in (100, 300):
        ids = torch.randint(0, 4096, (2, t), device="cuda")
        emb = model.llm.get_input_embeddings()(torch.cat([ids, ids[:, :1]], 1))[:, :t]  # a view, as spliced
        model.llm(inputs_embeds=emb, use_cache=False).logits.float().mean().backward()
    g1 = compile_counters()["graphs"]
    with torch.no_grad(), parts.eval_context():
        model.llm(input_ids=torch.randint(0, 4096, (2, 200), device="cuda"), use_cache=False)
    assert g1 - g0 == 1 and compile_counters()["graphs"] == g1


def test_graphs_captured_inside_the_tf32_scope_use_tf32():
    """speed.tf32 reaches the CUDA graphs: every graph is captured inside the run's flag scope, so the fp32
    encoder's graphed rows are the eager TF32 rows (up to the kernel choice), far nearer them than the full-fp32
    rows, which differ from TF32 by TF32's rounding."""
    from brisk.bench.harness import build_runner, sample_stream
    from brisk.speed.flags import tf32_scope

    cfg = _cfg(*FAST, "speed.tf32=true", "speed.encoder_dtype=fp32")
    runner = build_runner(cfg)  # captures every bucket's graphs up front, inside run_scope
    batch = runner.collate(sample_stream(cfg, 1, 4096)[0]).to("cuda")
    graphed = runner.step.audio(batch).clone()
    eager = runner.parts.accel.audio
    with tf32_scope(True):
        tf32 = eager(batch)
    full = eager(batch)
    assert _rel(tf32, full) > 1e-5  # TF32 visibly differs from fp32 on these rows
    assert _rel(graphed, tf32) < 0.1 * _rel(graphed, full)


def test_switches_leave_torch_flags_as_they_were():
    _run_steps([], 2)
    _run_steps(["speed.sdpa_backends=[flash,efficient,math]", "speed.tf32=true"], 2)


# ------------------------------------------------------------------------------ resume on the fast path
def test_graphed_run_resumed_equals_uninterrupted(tmp_path):
    from brisk.train.run import build_trainer, train

    common = RUN + FAST + ["train.max_steps=6", "train.save_every=3", "train.keep_n=5"]
    one, two = tmp_path / "one", tmp_path / "two"
    train(_cfg(*common, f"train.output_dir={one}"))
    (two / "checkpoints").mkdir(parents=True)
    for f in [one / "checkpoints" / "ckpt-00000003.pt", *(one / "checkpoints").glob("frozen-*.pt")]:
        shutil.copy(f, two / "checkpoints")  # the checkpoint and the frozen weights it references
    (two / "checkpoints" / "index.json").write_text(json.dumps({"ckpt-00000003.pt": {"step": 3}}))
    trainer = build_trainer(_cfg(*common, f"train.output_dir={two}", "train.resume=true"))
    lr = trainer.optimizer.param_groups[0]["lr"]
    assert trainer.pos.step == 3 and lr.is_cuda and float(lr) > 0  # the device tensor the graphs read
    assert float(lr) == pytest.approx(trainer.schedule.lr_at(4), rel=1e-6)  # restored after the lr-0 warm-ups
    assert all(s["step"].is_cuda for s in trainer.optimizer.state.values())
    trainer.fit()
    three, a, b = _ckpt(one, 3)["state_dict"], _ckpt(one, 6)["state_dict"], _ckpt(two, 6)["state_dict"]
    keys = _trainable(a)
    moved_a = sum((a[k].float() - three[k].float()).norm() ** 2 for k in keys) ** 0.5
    moved_b = sum((b[k].float() - three[k].float()).norm() ** 2 for k in keys) ** 0.5
    assert moved_b > 0.5 * moved_a > 0  # the resumed run trained (lr 0 would leave it at exactly 0)
    gap = sum((a[k].float() - b[k].float()).norm() ** 2 for k in keys) ** 0.5
    assert gap < 0.05 * moved_a  # and trained like the uninterrupted run, within bf16 noise


# --------------------------------------------------------------------------------- what is saved
def test_bf16_encoder_run_exports_the_fp32_encoder_bit_identical(tmp_path):
    from brisk.models.build import build_model, read_state_dict
    from brisk.train.run import train

    cfg = _cfg(*RUN, *FAST, "speed.encoder_dtype=bf16", "train.max_steps=2", "train.export=funasr",
               "train.export_dtype=fp32", f"data.tokenizer={REPO / 'data/demo/tokenizer'}", f"train.output_dir={tmp_path}")
    original = build_model(cfg, "cuda").state_dict()
    train(cfg)
    keys = [k for k in original if k.startswith(("audio_encoder.", "audio_adaptor."))]
    for saved in (_ckpt(tmp_path, 2)["state_dict"], read_state_dict(tmp_path / "model-funasr" / "model.pt")):
        for k in keys:
            assert saved[k].dtype == torch.float32 and torch.equal(saved[k], original[k].cpu()), k


# ----------------------------------------------------------------------------------------- probe
def test_graphed_probe_module_norms_are_before_clipping(tmp_path):
    from brisk.train.run import train

    clip = 1e-3
    train(_cfg(*RUN, *FAST, "train.max_steps=3", "train.save_final=false", "probe.enabled=true",
               "probe.param_norm_steps=[1,2,3]", f"optim.grad_clip={clip}", f"train.output_dir={tmp_path}"))
    rows = [json.loads(x) for x in (tmp_path / "probe.rank0.jsonl").read_text().splitlines()[1:]]
    rec = {(r["step"], r["metric"]): r["value"] for r in rows}
    for s in (1, 2, 3):
        total = rec[(s, "grad_norm")]
        parts = [v for (st, m), v in rec.items() if st == s and m.startswith("grad_norm.")]
        assert total > 10 * clip and len(parts) > 3
        assert sum(v * v for v in parts) == pytest.approx(total * total, rel=1e-3)


# ------------------------------------------------------------------------------ decoding while training
@pytest.mark.parametrize("fast", [False, True], ids=["generate", "fast_decoder"])
def test_val_decode_on_the_packed_cuda_path(tmp_path, fast):
    """Packed CUDA training rows run brisk_varlen attention; validation decoding runs left-padded rows with a KV
    cache, under sdpa for its duration (Accelerated.decode_context), with either decoder; the run goes on."""
    from brisk.config import load_config
    from brisk.train.run import train

    cfg = load_config(REPO / "configs" / "demo.yaml", [
        *RUN, "train.device=cuda", "speed.packing=true", "train.max_steps=2", "train.val_decode=4",
        f"train.val_decode_fast={str(fast).lower()}", "data.num_workers=0", "train.save_final=false",
        f"train.output_dir={tmp_path}"])
    result = train(cfg)
    decoded = [h for h in result["history"] if "cer" in h]
    assert len(decoded) == 2 and all(h["decoded"] == 4 for h in decoded)  # before step 1 and at the end
    assert result["step"] == 2
