"""Greedy decoding: brisk's Recognizer against FunASR 1.4.16's own ``FunASRNano.inference``.

A random small FunASRNano (built as tests/test_funasr_parity.py builds it) and brisk's model with its weights
decode the same demo utterances; the generated token ids must be identical. The LLM folder's config sets
eos_token_id to the demo tokenizer's <|im_end|>, as the real Qwen3 config does for its own.
"""

from __future__ import annotations

import pytest
import torch

from brisk.families import section
from brisk.families.fun_asr_nano.decode import decoding_frontend
from brisk.eval.decode import Recognizer, inference_prompt
from brisk.models.build import build_model

from .conftest import DEMO, TINY_QWEN3, nano_config
from .test_funasr_parity import AD, ENC, funasr_nano

MAX_NEW = 12
N_UTTS = 6


@pytest.fixture(scope="module")
def llm_folder(tmp_path_factory, tokenizer):
    from transformers import AutoConfig

    folder = tmp_path_factory.mktemp("qwen3_eos")
    extra = {**TINY_QWEN3, "vocab_size": len(tokenizer), "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>")}
    AutoConfig.for_model(extra.pop("model_type"), **extra).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(llm_folder):
    ref = funasr_nano(llm_folder)
    # transformers' init (std 0.02) makes a tiny random LLM repeat one token whatever it hears; weights of
    # std 1/sqrt(fan_in) give transcripts that change with the audio and the prompt, so ids can disagree.
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in ref.llm.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    cfg = nano_config(llm_folder, ENC, AD)
    ours = build_model(cfg).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours, cfg


def _paths() -> list[str]:
    return [str(p) for p in sorted((DEMO / "audio" / "valid").glob("*.flac"))[:N_UTTS]]


def _funasr_ids(ref, tokenizer, paths, **kwargs) -> list[list[int]]:
    """FunASR's single-utterance inference path, capturing what its llm.generate returns."""
    from funasr.frontends.wav_frontend import WavFrontend

    frontend = WavFrontend(fs=16000, window="hamming", n_mels=80, frame_length=25, frame_shift=10, lfr_m=7, lfr_n=6,
                           dither=0.0)
    captured = []
    generate = ref.llm.generate

    def spy(*args, **kw):
        out = generate(*args, **kw)
        captured.append(out[0].tolist())
        return out

    ref.llm.generate = spy
    try:
        for i, p in enumerate(paths):
            ref.inference([p], key=[f"u{i}"], tokenizer=tokenizer, frontend=frontend, device="cpu", max_length=MAX_NEW,
                          **kwargs)
    finally:
        del ref.llm.generate
    return captured


def _strip(ids: list[int], stop: int) -> list[int]:
    return ids[: ids.index(stop)] if stop in ids else ids


@pytest.mark.parametrize("kwargs", [{}, {"language": "英文", "itn": False}], ids=["default", "language-no-itn"])
def test_greedy_ids_match_funasr_inference(models, tokenizer, kwargs):
    ref, ours, cfg = models
    fe = decoding_frontend(section(cfg).frontend)
    paths = _paths()
    expected = _funasr_ids(ref, tokenizer, paths, **kwargs)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = [_strip(e, stop) for e in expected]
    rec = Recognizer(ours, tokenizer, fe, prompt=inference_prompt(**kwargs), max_new_tokens=MAX_NEW)
    got = [r.ids for r in rec.transcribe(paths, batch_size=1)]
    assert len(got) == len(paths) >= 5
    # Something was generated, and it depends on the audio: the comparison means something.
    assert all(len(e) > 0 for e in expected) and len({tuple(e) for e in expected}) > 1
    assert got == expected
    # Batched (left padding) gives the same ids as one at a time.
    assert [r.ids for r in rec.transcribe(paths, batch_size=len(paths))] == expected
    # The fast decoder (static cache, the same step code that CUDA captures), single and batched: 6 rows pad to
    # a bucket of 8; 4 + 2 take buckets of 4 and 2, their features read on a thread ahead (the default on CUDA).
    fast = Recognizer(ours, tokenizer, fe, prompt=inference_prompt(**kwargs), max_new_tokens=MAX_NEW, fast=True)
    for batch_size in (1, len(paths)):
        assert [r.ids for r in fast.transcribe(paths, batch_size=batch_size)] == expected, batch_size
    fast.prefetch = True
    assert [r.ids for r in fast.transcribe(paths, batch_size=4)] == expected
    buckets = Recognizer(ours, tokenizer, fe, prompt=inference_prompt(**kwargs), max_new_tokens=MAX_NEW,
                         fast_buckets=True)
    assert [r.ids for r in buckets.transcribe(paths, batch_size=4)] == expected
    # Features one utterance at a time on the CPU (the training loader's path) instead of Frontend.batch.
    per_utt = Recognizer(ours, tokenizer, fe, prompt=inference_prompt(**kwargs), max_new_tokens=MAX_NEW,
                         device_features=False)
    assert [r.ids for r in per_utt.transcribe(paths, batch_size=len(paths))] == expected
    # Several decode steps a replay (eager on the CPU: the same steps, grouped as the graphs group them).
    multi = Recognizer(ours, tokenizer, fe, prompt=inference_prompt(**kwargs), max_new_tokens=MAX_NEW,
                       fast_buckets=True, fast_multi_step=True)
    assert [r.ids for r in multi.transcribe(paths, batch_size=4)] == expected
    assert multi._fast.multi_step and multi._fast.replays < buckets._fast.replays


def test_decoding_a_training_model_switches_it_to_eval_and_back(models, tokenizer):
    """Validation decodes a model in train mode: every module is in eval mode during the decode (no dropout) and
    in train mode after; a model in eval mode (brisk eval) is decoded as it is and stays so."""
    _, ours, cfg = models
    fe = decoding_frontend(section(cfg).frontend)
    paths = _paths()[:2]
    rec = Recognizer(ours, tokenizer, fe, max_new_tokens=4)
    expected = [r.ids for r in rec.transcribe(paths, batch_size=2)]
    assert not any(m.training for m in ours.modules())
    seen = []
    hook = ours.llm.register_forward_pre_hook(lambda m, a: seen.append([x.training for x in ours.modules()]))
    try:
        ours.train()
        assert [r.ids for r in rec.transcribe(paths, batch_size=2)] == expected
        assert seen and not any(any(s) for s in seen)
        assert all(m.training for m in ours.modules())
    finally:
        hook.remove()
        ours.eval()


def test_decoding_keeps_a_frozen_module_of_a_training_model_in_eval_mode(models, tokenizer):
    """Training with speed.frozen_eval keeps its frozen encoder in eval mode inside a model in train mode
    (brisk.speed.frozen.training_mode); validation's decode gives every module back the mode it had, so the
    next training steps do not run the frozen encoder with dropout."""
    _, ours, cfg = models
    fe = decoding_frontend(section(cfg).frontend)
    rec = Recognizer(ours, tokenizer, fe, max_new_tokens=4)
    try:
        ours.train()
        ours.audio_encoder.eval()
        before = {n: m.training for n, m in ours.named_modules()}
        rec.transcribe(_paths()[:2], batch_size=2)
        assert {n: m.training for n, m in ours.named_modules()} == before
        assert ours.training and not ours.audio_encoder.training
    finally:
        ours.eval()


def test_prompt_is_funasr_get_prompt(models):
    ref = models[0]
    for kw in ({"hotwords": []}, {"hotwords": ["fox", "cup"], "language": "英文"}, {"hotwords": [], "itn": False}):
        assert inference_prompt(**kw) == ref.get_prompt(kw["hotwords"], kw.get("language"), kw.get("itn", True))


def test_encoder_bf16_copies_and_threaded_reading(models, tokenizer, monkeypatch):
    """--encoder-bf16: the encoder and adaptor run as bf16 copies (the model's own stay fp32 and unchanged), their
    outputs within bf16's rounding of the fp32 ones; the batch's audio read on threads comes back in input
    order, equal to reading one file at a time."""
    import brisk.eval.decode as decode
    from brisk.data.audio import read_audio

    _, ours, cfg = models
    fe = decoding_frontend(section(cfg).frontend)
    paths = _paths()
    rec = Recognizer(ours, tokenizer, fe, max_new_tokens=4, encoder_dtype=torch.bfloat16)
    monkeypatch.setattr(decode, "READERS", 3)
    waves = rec.read(paths)
    assert all(torch.equal(w, read_audio(p, rec.fs)) for w, p in zip(waves, paths))
    pool = rec._readers  # the reading threads are kept for the next batch, and given back by release
    assert pool is not None and rec.read(paths[::-1])[0].equal(waves[-1]) and rec._readers is pool
    speech, lengths = rec.frontend.batch(waves, "cpu")
    with torch.no_grad():
        ref = ours.encode_audio(speech, lengths)
        got = rec.encode(speech, lengths)
    path = rec.audio_path()
    assert path is not ours and next(path.audio_encoder.parameters()).dtype == torch.bfloat16
    assert next(ours.audio_encoder.parameters()).dtype == torch.float32
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    rel = (got.float() - ref).norm() / ref.norm()
    assert 0 < rel < 0.05, rel  # bf16 rounding through the encoder, not another computation
    assert len(rec.transcribe(paths[:2], batch_size=2)) == 2
    rec.release()
    assert rec._readers is None and pool._shutdown
    assert Recognizer(ours, tokenizer, fe).audio_path() is ours  # the default: the model's own modules
