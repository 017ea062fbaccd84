"""brisk.eval.fast_decode: the static-cache greedy decoder against the LLM's own generate, on a tiny random Qwen3.

FunASR parity of the whole Recognizer path is in tests/test_decode_parity.py; here the decoder alone, on random
left-padded prompt embeddings: same ids as ``generate`` (SDPA and eager attention), the stop check every k
tokens, rooms reused and grown, buckets, and the refusals. tests/gpu/test_fast_decode_gpu.py reuses
``tiny_llm`` and ``reference_ids`` for the graphed path.
"""

from __future__ import annotations

import pytest
import torch

from brisk.eval.fast_decode import FastGreedy, bucket, cache_argument, replays

from .conftest import TINY_QWEN3

PAD = 0


def tiny_llm(attn: str = "sdpa", device: str = "cpu", **extra):
    """A tiny random Qwen3 whose greedy output changes with its input (weights of std 1/sqrt(fan_in))."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {**TINY_QWEN3, **extra}
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    llm = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in llm.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return llm.to(device).eval()


def prompts(llm, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompt embeddings [B, T, D] (zeros in the padding) and their mask [B, T]."""
    g = torch.Generator().manual_seed(seed)
    d = llm.config.hidden_size
    t = max(lengths)
    embeds = torch.zeros(len(lengths), t, d)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        embeds[i, t - n:] = torch.randn(n, d, generator=g)
        mask[i, t - n:] = 1
    dev = llm.device
    return embeds.to(dev), mask.to(dev)


def cut(rows: list[list[int]], stop: list[int]) -> list[list[int]]:
    return [r[:next((j for j, x in enumerate(r) if x in stop), len(r))] for r in rows]


@torch.no_grad()
def reference_ids(llm, embeds, mask, stop: list[int], max_new: int) -> list[list[int]]:
    """What brisk's plain decoder does: the LLM's own greedy generate."""
    out = llm.generate(inputs_embeds=embeds, attention_mask=mask, do_sample=False, num_beams=1, max_new_tokens=max_new,
                       eos_token_id=stop, pad_token_id=PAD)
    return cut(out.tolist(), stop)


def stop_tokens(llm, embeds, mask) -> list[int]:
    """A stop token that some rows emit early and others never: the ids then stop at different steps."""
    free = reference_ids(llm, embeds, mask, [], 16)
    return [free[0][3]]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "llm_step"])
@pytest.mark.parametrize("buckets", [False, True], ids=["exact", "buckets"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_same_ids_as_generate(attn, buckets, fused):
    llm = tiny_llm(attn)
    embeds, mask = prompts(llm, [9, 5, 12])  # a bucket of 4: one row of bucket padding
    stop = stop_tokens(llm, embeds, mask)
    expected = reference_ids(llm, embeds, mask, stop, 20)
    assert len({len(e) for e in expected}) > 1  # rows stop at different steps, or run to the cap
    dec = FastGreedy(llm, stop, PAD, torch.float32, "cpu", buckets=buckets, fused=fused)
    assert (dec.fused is not None) == fused
    got = cut(dec.generate(embeds, mask, 20).tolist(), stop)
    assert got == expected
    # The host's look at the finished mask every k tokens changes nothing.
    assert cut(FastGreedy(llm, stop, PAD, torch.float32, "cpu", check_every=1, buckets=buckets, fused=fused).generate(
        embeds, mask, 20).tolist(), stop) == expected
    # With buckets the prompt of 12 is left padded to 32 (the prefill buffers of that length); without, not.
    assert sorted(t for r in dec.rooms.values() for t in r.prefills) == ([32] if buckets else [12])


@pytest.mark.parametrize("fuse", [True, False], ids=["concatenated", "own_gemms"])
@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "llama"])
def test_fused_step_attends_over_buckets_of_the_filled_slots(model_type, fuse):
    """The fused step (attention over SPAN_MIN x 2^k slots; one q/k/v and one gate/up GEMM a layer, or the
    LLM's own five) across span boundaries (64, 128, the room's length) gives generate's ids, for Qwen3 (q/k
    norms), Qwen2 (q/k/v biases) and Llama."""
    extra = {"attention_bias": True} if model_type == "llama" else {}
    llm = tiny_llm(model_type=model_type, **extra)
    assert type(llm).__name__.lower().startswith(model_type)
    embeds, mask = prompts(llm, [20, 13], seed=7)
    dec = FastGreedy(llm, [], PAD, torch.float32, "cpu", fuse=fuse)
    assert dec.fused is not None and dec.fused.fuse == fuse
    assert dec.generate(embeds, mask, 150).tolist() == reference_ids(llm, embeds, mask, [], 150)
    room = dec.rooms[2]
    assert room.length == 192  # 20 + 150, rounded up to CACHE_ROUND
    assert [dec.span(room, f) for f in (1, 64, 65, 128, 129, 170, 192)] == [64, 64, 128, 128, 192, 192, 192]
    layer = llm.model.layers[0]
    w, b = dec.fused.qkv[0]
    a = layer.self_attn
    if fuse:
        assert torch.equal(w, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        assert (b is None) == (a.q_proj.bias is None) and (b is not None or model_type == "qwen3")
    else:  # the modules' own tensors, no copies
        assert [x is y for x, y in zip(w, (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight))] == [True] * 3
        assert b[0] is a.q_proj.bias and dec.fused.sources == []


def test_fuse_defaults_to_concatenated_gemms_only_when_compiled():
    """fuse=None (what --fast gives): the LLM's own GEMMs eagerly (its bf16 rounding), concatenated ones under
    --fast-compile (Inductor rounds otherwise anyway); an explicit fuse wins either way."""
    llm = tiny_llm()
    assert FastGreedy(llm, [], PAD, torch.float32, "cpu").fused.fuse is False
    assert FastGreedy(llm, [], PAD, torch.float32, "cpu", compile="eager").fused.fuse is True
    assert FastGreedy(llm, [], PAD, torch.float32, "cpu", compile="eager", fuse=False).fused.fuse is False
    assert FastGreedy(llm, [], PAD, torch.float32, "cpu", fuse=True).fused.fuse is True


def test_fused_weights_follow_the_model_and_refusals_fall_back():
    """Weights changed in place after the step was built (an optimizer step between validations, even one
    autograd does not see) are copied into the fused ones, in place (graphs keep their pointers); an LLM the fused step cannot run (another
    activation, LoRA layers) decodes with its own forward."""
    llm = tiny_llm()
    embeds, mask = prompts(llm, [8, 11], seed=8)
    dec = FastGreedy(llm, [], PAD, torch.float32, "cpu", fuse=True)
    before = dec.generate(embeds, mask, 12).tolist()
    fused = dec.fused.gate_up[1][0]
    with torch.no_grad():
        for p in llm.parameters():
            if p.dim() == 2:
                p.mul_(1.5)
    after = dec.generate(embeds, mask, 12).tolist()
    assert after == reference_ids(llm, embeds, mask, [], 12) and after != before
    assert dec.fused.gate_up[1][0] is fused
    m = llm.model.layers[1].mlp
    assert torch.equal(fused, torch.cat([m.gate_proj.weight, m.up_proj.weight]))
    # A change autograd does not see (a CUDA-graphed optimizer step: no version counter moves) is copied too.
    for p in llm.parameters():
        if p.dim() == 2:
            p.data.div_(1.5)
    again = dec.generate(embeds, mask, 12).tolist()
    assert again == reference_ids(llm, embeds, mask, [], 12) and again != after
    # Unfused, the step reads the modules' own weights: a change is seen without a copy.
    own = FastGreedy(llm, [], PAD, torch.float32, "cpu", fuse=False)
    assert own.generate(embeds, mask, 12).tolist() == again
    with torch.no_grad():
        for p in llm.parameters():
            if p.dim() == 2:
                p.mul_(1.5)
    assert own.generate(embeds, mask, 12).tolist() == after

    # Frozen weights (brisk eval's model: load_run turns gradients off) are copied only when a version moved, not
    # before every batch: a change no version counter sees leaves the fused copy as it was.
    llm.requires_grad_(False)
    frozen = FastGreedy(llm, [], PAD, torch.float32, "cpu", fuse=True)
    frozen.generate(embeds, mask, 4)
    copy = frozen.fused.gate_up[1][0].clone()
    for p in llm.parameters():
        if p.dim() == 2:
            p.data.mul_(2.0)
    frozen.generate(embeds, mask, 4)
    assert torch.equal(frozen.fused.gate_up[1][0], copy)
    with torch.no_grad():  # a version moves (a checkpoint loaded in place): copied
        m.gate_proj.weight.mul_(1.0)
    frozen.generate(embeds, mask, 4)
    assert torch.equal(frozen.fused.gate_up[1][0], torch.cat([m.gate_proj.weight, m.up_proj.weight]))

    gelu = tiny_llm(hidden_act="gelu")
    dec = FastGreedy(gelu, [], PAD, torch.float32, "cpu")
    assert dec.fused is None
    assert dec.generate(embeds, mask, 12).tolist() == reference_ids(gelu, embeds, mask, [], 12)
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(tiny_llm(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).base_model.model
    dec = FastGreedy(lora, [], PAD, torch.float32, "cpu")
    assert dec.fused is None
    assert dec.generate(embeds, mask, 12).tolist() == reference_ids(lora, embeds, mask, [], 12)


def test_rooms_are_reused_grown_and_released():
    llm = tiny_llm()
    dec = FastGreedy(llm, [], PAD, torch.float32, "cpu")
    embeds, mask = prompts(llm, [7, 4], seed=1)
    first = dec.generate(embeds, mask, 10)
    room = dec.rooms[2]
    cache_keys = room.cache.layers[0].keys
    # A second batch of the same bucket: the same room (cache tensors kept), fresh results.
    embeds2, mask2 = prompts(llm, [3, 6], seed=2)
    assert dec.generate(embeds2, mask2, 10).tolist() == reference_ids(llm, embeds2, mask2, [], 10)
    assert dec.rooms[2] is room and room.cache.layers[0].keys is cache_keys
    # The first batch again: the stale slots of the second are masked out.
    assert dec.generate(embeds, mask, 10).tolist() == first.tolist()
    # A batch that needs more slots than the room has replaces it with a longer one.
    embeds3, mask3 = prompts(llm, [5, 2], seed=3)
    long = room.length + 5
    assert dec.generate(embeds3, mask3, long).tolist() == reference_ids(llm, embeds3, mask3, [], long)
    assert dec.rooms[2] is not room and dec.rooms[2].length >= 5 + long
    dec.release()
    assert dec.rooms == {}
    # The fused step's weight copies go with the rooms (a GPU test saw a released decoder keep them until the
    # garbage collector ran), and come back on the next call with the same ids.
    assert dec.fused is not None and dec.fused.qkv is None and dec.fused.weights is None
    assert dec.generate(embeds, mask, 10).tolist() == first.tolist()
    assert dec.fused.weights is not None


def test_stops_early_when_every_row_is_finished():
    llm = tiny_llm()
    embeds, mask = prompts(llm, [6, 6], seed=4)
    free = reference_ids(llm, embeds, mask, [], 4)
    stop = sorted({free[0][1], free[1][1]})  # both rows finish by their second token
    dec = FastGreedy(llm, stop, PAD, torch.float32, "cpu", check_every=2)
    out = dec.generate(embeds, mask, 40)
    assert cut(out.tolist(), stop) == reference_ids(llm, embeds, mask, stop, 40)
    assert int(dec.rooms[2].step) <= 4  # not 40: the host saw every row finished after the first check
    assert (out[:, 4:] == 0).all()


def test_buckets_and_refusals():
    assert [bucket(n) for n in (1, 2, 3, 5, 16, 17, 64, 65, 130)] == [1, 2, 4, 8, 16, 32, 64, 128, 192]
    llm = tiny_llm()
    import transformers

    known = {"5.17": "past_key_values", "5.24": "cache"}  # the two versions brisk runs on
    expected = known.get(".".join(transformers.__version__.split(".")[:2]))
    assert cache_argument(llm) in ("cache", "past_key_values")
    assert expected is None or cache_argument(llm) == expected
    with pytest.raises(ValueError, match="CUDA"):
        FastGreedy(llm, [], PAD, torch.float32, "cpu", graphs=True)
    sliding = tiny_llm(layer_types=["full_attention", "sliding_attention"], use_sliding_window=True, sliding_window=8)
    with pytest.raises(ValueError, match="only full attention"):
        FastGreedy(sliding, [], PAD, torch.float32, "cpu")


def test_val_decode_fast_needs_val_decode():
    from brisk.config import ConfigError, TrainConfig

    assert TrainConfig(val_decode=4, val_decode_fast=True).val_decode_fast
    with pytest.raises(ConfigError, match="train.val_decode_fast"):
        TrainConfig(val_decode_fast=True)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "llm_step"])
def test_the_step_is_one_dynamo_graph(fused):
    """What ``compile="inductor"`` compiles on CUDA: traced here with Dynamo alone, without graph breaks, and
    the same ids. The LLM's step is one graph; the fused step four: the prologue, one layer (one graph for every
    layer: no recompile a layer), the tail and the bookkeeping; a longer room with three spans recompiles them
    for dynamic shapes once, and its second batch compiles nothing."""
    from torch._dynamo.utils import counters

    llm = tiny_llm()
    embeds, mask = prompts(llm, [9, 5, 12], seed=6)
    torch._dynamo.reset()
    counters.clear()
    dec = FastGreedy(llm, [], PAD, torch.float32, "cpu", compile="eager", fused=fused)
    assert dec.generate(embeds, mask, 8).tolist() == reference_ids(llm, embeds, mask, [], 8)
    assert counters["stats"]["unique_graphs"] == (4 if fused else 1) and not counters["graph_break"]
    if fused:
        expected = reference_ids(llm, embeds, mask, [], 150)
        assert dec.generate(embeds, mask, 150).tolist() == expected  # spans 64, 128, 192 in a longer room
        graphs = counters["stats"]["unique_graphs"]
        assert dec.generate(embeds, mask, 150).tolist() == expected
        assert counters["stats"]["unique_graphs"] == graphs and not counters["graph_break"]  # no more compiles
        # A second decoder of the same LLM (a new Recognizer) reuses the compiled code.
        again = FastGreedy(llm, [], PAD, torch.float32, "cpu", compile="eager")
        assert again.generate(embeds, mask, 150).tolist() == expected
        assert counters["stats"]["unique_graphs"] == graphs
    torch._dynamo.reset()


def test_fused_step_traced_under_bf16_autocast():
    """The decode dtype's autocast wraps the compiled pieces (what --fast-compile runs in bf16 on CUDA): traced by
    AOTAutograd (the backend Inductor builds on) they give the eager fused step's bf16 ids."""
    llm = tiny_llm().to(torch.bfloat16)
    embeds, mask = prompts(llm, [9, 5, 12], seed=9)
    embeds = embeds.to(torch.bfloat16)
    torch._dynamo.reset()
    eager = FastGreedy(llm, [], PAD, torch.bfloat16, "cpu", fuse=True).generate(embeds, mask, 70)  # spans 64, 128
    traced = FastGreedy(llm, [], PAD, torch.bfloat16, "cpu", compile="aot_eager").generate(embeds, mask, 70)
    torch._dynamo.reset()
    assert torch.equal(eager, traced)


def test_replays_cut_a_check_where_the_span_changes():
    """Several steps a replay: each run of equal spans in a check is one replay, in order, covering every step
    once; without multi_step a replay a step."""
    spans = [64, 64, 64, 128, 128, 128, 128, 256]
    assert replays(spans, True) == [(64, 3), (128, 4), (256, 1)]
    assert replays(spans, False) == [(s, 1) for s in spans]
    assert replays([64] * 8, True) == [(64, 8)] and replays([], True) == []
    for multi in (True, False):  # the steps, expanded back, are the spans given
        assert [s for s, n in replays(spans, multi) for _ in range(n)] == spans


@pytest.mark.parametrize("buckets", [False, True], ids=["exact", "buckets"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "llm_step"])
def test_multi_step_replays_give_the_same_ids_in_fewer_replays(fused, buckets):
    """A replay of several steps (eager here: the same steps in the same order) gives the one-step-a-replay ids
    and generate's, across the span boundaries at 64 and 128 filled slots and with rows stopping early; the
    host runs one replay a check (two where a span boundary cuts it) instead of one a token."""
    llm = tiny_llm()
    embeds, mask = prompts(llm, [20, 13, 7], seed=9)
    stop = stop_tokens(llm, embeds, mask)
    one = FastGreedy(llm, stop, PAD, torch.float32, "cpu", fused=fused, buckets=buckets)
    multi = FastGreedy(llm, stop, PAD, torch.float32, "cpu", fused=fused, buckets=buckets, multi_step=True)
    a, b = one.generate(embeds, mask, 120), multi.generate(embeds, mask, 120)
    assert torch.equal(a, b)
    assert cut(b.tolist(), stop) == reference_ids(llm, embeds, mask, stop, 120)
    checks = -(-int(one.rooms[4].step - 1) // one.check_every)  # the checks the host made (rows may stop early)
    assert one.replays == int(one.rooms[4].step) - 1  # a replay a token after the prefill's
    boundaries = 2 if fused else 0  # the fused step's spans 64 -> 128 -> 192 may cut a check in two
    assert checks <= multi.replays <= checks + boundaries < one.replays
    # Without a stop token every row runs to the cap: 119 steps, 15 checks of 8 (the last of 7).
    free = FastGreedy(llm, [], PAD, torch.float32, "cpu", fused=fused, buckets=buckets, multi_step=True)
    assert torch.equal(free.generate(embeds, mask, 120),
                       FastGreedy(llm, [], PAD, torch.float32, "cpu", fused=fused, buckets=buckets).generate(
                           embeds, mask, 120))
    assert 15 <= free.replays <= 15 + boundaries


def test_compile_spec_carries_an_inductor_mode(monkeypatch):
    """--fast-compile-mode MODE compiles the fused step's pieces with that Inductor mode ("inductor:MODE");
    a mode that would capture CUDA graphs inside the decoder's own (reduce-overhead) is refused."""
    from brisk.cli import build_parser
    from brisk.eval import decode_step
    from brisk.eval.evaluate import compile_spec

    p = build_parser()
    assert compile_spec(p.parse_args(["eval", "run", "d.jsonl"])) is None
    assert compile_spec(p.parse_args(["eval", "run", "d.jsonl", "--fast-compile"])) == "inductor"
    args = p.parse_args(["transcribe", "run", "a.wav", "--fast-compile-mode", "max-autotune-no-cudagraphs"])
    assert compile_spec(args) == "inductor:max-autotune-no-cudagraphs"
    for batch, mode in (("1", "max-autotune-no-cudagraphs"), ("16", "default")):  # auto: by the measured trade
        args = p.parse_args(["eval", "run", "d.jsonl", "--fast-compile-mode", "auto", "--batch-size", batch])
        assert compile_spec(args) == f"inductor:{mode}"
    with pytest.raises(SystemExit):
        p.parse_args(["eval", "run", "d.jsonl", "--fast-compile-mode", "reduce-overhead"])

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    FastGreedy(tiny_llm(), [], PAD, torch.float32, "cpu", compile="inductor:max-autotune-no-cudagraphs")
    assert seen and all(kw == {"backend": "inductor", "mode": "max-autotune-no-cudagraphs"} for kw in seen)
    with pytest.raises(ValueError, match="reduce-overhead"):
        decode_step.compiled(len, "inductor:reduce-overhead")


def test_compile_spec_refuses_modes_off_inductor_and_nested_graphs():
    from brisk.eval import decode_step

    with pytest.raises(ValueError, match="Inductor's"):
        decode_step.compiled(len, "eager:max-autotune-no-cudagraphs")
    with pytest.raises(ValueError, match="cudagraphs"):
        decode_step.compiled(len, "cudagraphs")
    assert decode_step.compiled(len, None) is len
