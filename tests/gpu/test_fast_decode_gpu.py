"""The fast greedy decoder on CUDA (skipped without it): the captured step against the same step run eagerly and
against the LLM's own generate, the compiled step, a training graph's pool left alone, and brisk's Recognizer.

    python -m pytest tests/gpu/test_fast_decode_gpu.py -q        # on the GPU machine
"""

from __future__ import annotations

import pytest
import torch

from brisk.eval.fast_decode import FastGreedy

from ..test_fast_decode import PAD, cut, prompts, reference_ids, stop_tokens, tiny_llm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BATCHES = ([9, 5, 12], [7], [4, 11, 6, 8, 9, 3, 10, 5, 12, 7, 6, 9, 8, 5, 4, 11, 10])  # buckets 4, 1, 32


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "llm_step"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_graphed_fp32_gives_generates_ids(attn, fused):
    llm = tiny_llm(attn, "cuda")
    for i, lengths in enumerate(BATCHES):
        embeds, mask = prompts(llm, lengths, seed=i)
        stop = stop_tokens(llm, embeds, mask)  # rows stop at different steps (the graph's stop tensor is fixed)
        graphed = FastGreedy(llm, stop, PAD, torch.float32, "cuda", buckets=True, fused=fused)
        eager = FastGreedy(llm, stop, PAD, torch.float32, "cuda", graphs=False, buckets=True, fused=fused)
        assert (graphed.fused is not None) == fused
        expected = reference_ids(llm, embeds, mask, stop, 24)
        a = graphed.generate(embeds, mask, 24)
        b = eager.generate(embeds, mask, 24)
        assert graphed.graphs and not eager.graphs and all(r.graphs for r in graphed.rooms.values())
        # The prefill is a graph too (one a room and padded prompt length), the eager decoder's is not.
        assert all(p.graph is not None for r in graphed.rooms.values() for p in r.prefills.values())
        assert all(p.graph is None for r in eager.rooms.values() for p in r.prefills.values())
        assert torch.equal(a, b), lengths  # the replayed graph computes what the eager step computes
        assert cut(a.tolist(), stop) == expected, lengths
        # A second batch of the same bucket replays the same graph.
        embeds2, mask2 = prompts(llm, lengths, seed=100 + i)
        assert cut(graphed.generate(embeds2, mask2, 24).tolist(), stop) == reference_ids(llm, embeds2, mask2, stop, 24)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "llm_step"])
def test_graphed_bf16_equals_eager_bf16(fused):
    llm = tiny_llm("sdpa", "cuda").to(torch.bfloat16)
    embeds, mask = prompts(llm, BATCHES[2], seed=7)
    embeds = embeds.to(torch.bfloat16)
    a = FastGreedy(llm, [], PAD, torch.bfloat16, "cuda", fused=fused).generate(embeds, mask, 32)
    b = FastGreedy(llm, [], PAD, torch.bfloat16, "cuda", graphs=False, fused=fused).generate(embeds, mask, 32)
    assert torch.equal(a, b)


@pytest.mark.parametrize("compile", [None, "inductor"])
def test_fused_step_a_graph_per_span_gives_generates_ids(compile):
    """The fused step across span boundaries (64, 128, a room's 192): one graph a span, replayed in turn,
    fp32 ids equal to generate's; compiled, one layer graph serves every layer and span."""
    torch._dynamo.reset()
    llm = tiny_llm("sdpa", "cuda")
    dec = FastGreedy(llm, [], PAD, torch.float32, "cuda", compile=compile)
    for i, lengths in enumerate(([20, 13], [7])):
        embeds, mask = prompts(llm, lengths, seed=20 + i)
        assert dec.generate(embeds, mask, 120).tolist() == reference_ids(llm, embeds, mask, [], 120), lengths
    assert dec.fused is not None and {n: sorted(s for s, _ in r.graphs) for n, r in dec.rooms.items()} == {
        2: [64, 128, 192], 1: [64, 128]}  # rooms of 192 and 128 slots
    torch._dynamo.reset()


@pytest.mark.parametrize("compile", [None, "inductor"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "llm_step"])
def test_multi_step_graphs_give_the_one_step_graphs_ids(fused, compile):
    """bf16, length buckets, rows stopping early, across the span boundaries at 64 and 128: a graph of a check's
    steps (cut where the span changes) replays the very kernels of the one-step graphs, so the ids are equal bit
    for bit, in fewer replays. One decoder runs both ways (the same compiled code, room and cache); its graphs
    are keyed (span, steps)."""
    torch._dynamo.reset()
    llm = tiny_llm("sdpa", "cuda").to(torch.bfloat16)
    embeds, mask = prompts(llm, BATCHES[2], seed=11)
    embeds = embeds.to(torch.bfloat16)

    def both(dec, max_new):
        out, replays = [], []
        for multi in (False, True):
            dec.multi_step, before = multi, dec.replays
            out.append(dec.generate(embeds, mask, max_new))
            replays.append(dec.replays - before)
        return out, replays

    for stop in (stop_tokens(llm, embeds, mask), []):  # rows stopping early; every row to the cap
        dec = FastGreedy(llm, stop, PAD, torch.bfloat16, "cuda", buckets=True, fused=fused, compile=compile)
        for max_new in (120, 40):  # the second batch replays the graphs the first captured
            (a, b), (one, multi) = both(dec, max_new)
            assert torch.equal(a, b), (stop, max_new)
            assert dec.graphs and multi < one, (multi, one)
            if not stop:  # 119 (39) steps: 15 (5) checks, a span boundary may cut one or two; one replay a token
                assert one == max_new - 1 and -(-one // 8) <= multi <= -(-one // 8) + 2, (one, multi)
        steps = {n for r in dec.rooms.values() for _, n in r.graphs}
        assert 1 in steps and dec.check_every in steps, steps
    torch._dynamo.reset()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "llm_step"])
def test_compiled_step_gives_the_same_ids(fused):
    torch._dynamo.reset()
    llm = tiny_llm("sdpa", "cuda")
    dec = FastGreedy(llm, [], PAD, torch.float32, "cuda", compile="inductor", fused=fused)
    for i, lengths in enumerate(BATCHES):  # three rooms: static compile, then one dynamic-shape compile
        embeds, mask = prompts(llm, lengths, seed=10 + i)
        assert dec.generate(embeds, mask, 16).tolist() == reference_ids(llm, embeds, mask, [], 16), lengths
    torch._dynamo.reset()


def test_decoding_leaves_a_training_graph_and_its_pool_alone():
    """A captured 'training step' (its own pool) replays the same before and after the decoder captured, replayed
    and released its graphs; a released decoder gives its memory back (the second round ends where the first did:
    what stays is cuBLAS's workspace for the capture stream, made once a process)."""
    torch.manual_seed(0)
    w = torch.randn(256, 256, device="cuda", requires_grad=True)
    x = torch.randn(64, 256, device="cuda")

    def step():
        loss = (x @ w).tanh().square().mean()
        loss.backward()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    w.grad = None
    pool = torch.cuda.graph_pool_handle()
    train = torch.cuda.CUDAGraph()
    with torch.cuda.graph(train, pool=pool):
        loss = step()
    train.replay()
    before = (loss.clone(), w.grad.clone())

    llm = tiny_llm("sdpa", "cuda")
    embeds, mask = prompts(llm, BATCHES[0], seed=3)
    ends = []
    for _ in range(2):
        dec = FastGreedy(llm, [], PAD, torch.float32, "cuda")
        assert dec.pool != pool
        first = dec.generate(embeds, mask, 16)
        train.replay()  # interleaved with the decoder's graphs
        assert dec.generate(embeds, mask, 16).tolist() == first.tolist()
        del first
        dec.release()
        del dec
        torch.cuda.synchronize()
        ends.append(torch.cuda.memory_allocated())
    assert ends[1] <= ends[0], ends
    w.grad.zero_()
    train.replay()
    torch.cuda.synchronize()
    assert torch.equal(loss, before[0]) and torch.equal(w.grad, before[1])


def test_recognizer_fast_equals_plain_on_cuda_fp32(tmp_path, tokenizer):
    """brisk's whole decode path (features, encoder, splice, decode) with --fast against the plain one."""
    from transformers import AutoConfig

    from brisk.families import section
    from brisk.families.fun_asr_nano.decode import decoding_frontend
    from brisk.eval.decode import Recognizer
    from brisk.models.build import build_model

    from ..conftest import DEMO, TINY_QWEN3, nano_config
    from ..test_funasr_parity import AD, ENC

    extra = {**TINY_QWEN3, "vocab_size": len(tokenizer), "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>")}
    AutoConfig.for_model(extra.pop("model_type"), **extra).save_pretrained(tmp_path)
    cfg = nano_config(tmp_path, ENC, AD)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in model.llm.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    model = model.cuda()
    paths = [str(p) for p in sorted((DEMO / "audio" / "valid").glob("*.flac"))[:6]]
    fe = decoding_frontend(section(cfg).frontend)
    plain = Recognizer(model, tokenizer, fe, device="cuda", max_new_tokens=16)
    fast = Recognizer(model, tokenizer, fe, device="cuda", max_new_tokens=16, fast=True)
    expected = [r.ids for r in plain.transcribe(paths, batch_size=1)]
    assert len({tuple(e) for e in expected}) > 1
    # Features on the GPU (the default, Frontend.batch) or one at a time on the CPU: the same transcripts.
    cpu_features = Recognizer(model, tokenizer, fe, device="cuda", max_new_tokens=16, device_features=False)
    assert [r.ids for r in cpu_features.transcribe(paths, batch_size=6)] == expected
    for batch_size in (1, 6):
        assert [r.ids for r in fast.transcribe(paths, batch_size=batch_size)] == expected, batch_size
    assert fast._fast.graphs and fast._encode is None  # the step graphed; encoder and prefill at generate's shapes
    fast.release()
    assert fast._fast is None
    # Length buckets: the encoder, the prefill and the step replayed from graphs (fp32 here: the same ids).
    buckets = Recognizer(model, tokenizer, fe, device="cuda", max_new_tokens=16, fast_buckets=True)
    for batch_size in (1, 6):
        assert [r.ids for r in buckets.transcribe(paths, batch_size=batch_size)] == expected, batch_size
    multi = Recognizer(model, tokenizer, fe, device="cuda", max_new_tokens=16, fast_buckets=True,
                       fast_multi_step=True)  # several tokens a replay
    assert [r.ids for r in multi.transcribe(paths, batch_size=6)] == expected
    assert multi._fast.multi_step and multi._fast.replays <= 2  # 15 steps: checks of 8 and 7 (one a token: 15)
    multi.release()
    assert buckets._encode.graphs and all(p.graph is not None for r in buckets._fast.rooms.values()
                                          for p in r.prefills.values())
    buckets.release()
    assert buckets._fast is None and buckets._encode is None


NEAR_TIE_ULPS = 4  # a near-tie: generate's top-1 - top-2 logit within this many bf16 rounding steps of its top-1


@pytest.mark.parametrize("variant", ["own_gemms", "concatenated", "compiled"])
def test_bf16_ids_part_from_generates_only_at_near_ties(variant):
    """bf16 at Qwen3-0.6B's layer widths (4 layers, 16 query and 8 key heads of 128, a 32k vocabulary), 16 rows
    of 48 tokens: each row's ids are generate's, or part from them at a token where generate's own top-1 - top-2
    logit is a near-tie (within NEAR_TIE_ULPS bf16 rounding steps of its top-1 logit), never at the first
    token. Rounding alone can only flip such ties; a wrong mask, position, cache slot or weight parts at
    ordinary margins (a few times the rounding step here) and early. The margins are printed."""
    import math

    torch._dynamo.reset()
    llm = tiny_llm("sdpa", "cuda", hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=32000).to(torch.bfloat16)
    embeds, mask = prompts(llm, [30, 22, 41, 17, 35, 28, 12, 39, 25, 33, 19, 44, 27, 36, 15, 31], seed=5)
    embeds = embeds.to(torch.bfloat16)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):  # as brisk's plain decoder runs it
        out = llm.generate(inputs_embeds=embeds, attention_mask=mask, do_sample=False, num_beams=1, max_new_tokens=48,
                           pad_token_id=PAD, output_logits=True, return_dict_in_generate=True)
    ref = out.sequences.tolist()
    top = torch.stack(out.logits, 1).float().topk(2, dim=-1).values  # [B, steps, 2]
    kw = {"own_gemms": dict(fuse=False), "concatenated": dict(fuse=True), "compiled": dict(compile="inductor")}[variant]
    dec = FastGreedy(llm, [], PAD, torch.bfloat16, "cuda", **kw)
    assert dec.fused is not None and dec.fused.fuse == (variant != "own_gemms")
    got = dec.generate(embeds, mask, 48).tolist()
    parts = []
    for i, (r, g) in enumerate(zip(ref, got)):
        j = next((k for k, (a, b) in enumerate(zip(r, g)) if a != b), None)
        if j is not None:
            t1, t2 = top[i, j].tolist()
            ulp = 2.0 ** (math.floor(math.log2(abs(t1))) - 7)
            parts.append((i, j, t1 - t2, (t1 - t2) / ulp))
    median = top[..., 0].sub(top[..., 1]).median().item()
    print(f"{variant}: {len(parts)} of {len(ref)} rows part from generate's ids; (row, token, margin, ulps): "
          f"{parts}; generate's median margin {median:.4f}")
    assert all(j > 0 and ulps <= NEAR_TIE_ULPS for _, j, _, ulps in parts), parts
    torch._dynamo.reset()
