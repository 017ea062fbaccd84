"""model.family=qwen3_asr, the audio tower: windows and real rows computed on the host (the model, always) against
transformers' encoder, and speed.audio_varlen (one attention call a layer for all windows) against transformers'
per-window attention, in fp32 on a tiny random Qwen3-ASR whose windows are 2 chunks (26 rows) long, so that
each utterance spans several windows."""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError
from brisk.data.collate import Collator
from brisk.families import family_of
from brisk.families.qwen3_asr.model import audio_token_count, audio_windows, run_audio_tower

from .test_qwen3_asr import config, recipe_jsonl, samples_of

LENGTHS = [345, 120, 77, 250, 99, 200, 3]  # mel frames: several windows, partial chunks, a chunk's last frames


def tiny(tmp_path, *over):
    cfg = config(tmp_path, *over)
    cfg.model.llm.config["audio_config"]["n_window_infer"] = 200  # a window: 2 chunks of 100 frames
    return cfg, family_of(cfg).build(cfg, "cpu")


def features(lengths, seed: int = 0):
    torch.manual_seed(seed)
    lengths = torch.tensor(lengths)
    frames = int(lengths.max())
    speech = torch.randn(len(lengths), frames, 128) * (torch.arange(frames)[None, :, None] < lengths[:, None, None])
    return speech, lengths


def transformers_rows(model, speech, lengths):
    """The audio rows as transformers computes them (its encoder forward, then the projector)."""
    pad = -speech.shape[1] % 100
    feats = torch.nn.functional.pad(speech, (0, 0, 0, pad)).transpose(1, 2)
    mask = (torch.arange(feats.shape[-1]) < lengths[:, None]).long()
    hidden = model.audio_tower(input_features=feats, input_features_mask=mask).last_hidden_state
    return model.multi_modal_projector(hidden)


def test_audio_token_count_equals_transformers_for_every_length():
    """The one host-side count (data and model both use it) against transformers' own, chunk edges included."""
    from transformers.models.qwen3_asr.modeling_qwen3_asr import _get_feat_extract_output_lengths

    frames = torch.arange(0, 451)
    assert [audio_token_count(int(n), 50) for n in frames] == _get_feat_extract_output_lengths(frames, 50).tolist()


@pytest.mark.parametrize("lengths", [LENGTHS, [40, 77, 12], [100, 200, 97, 300]])
def test_host_windows_equal_transformers(lengths):
    """cu_seqlens, the longest window and the real rows' indices, as transformers' encoder computes them on the
    device (also for a batch of utterances all shorter than a chunk, whose windows are shorter)."""
    from transformers import Qwen3ASREncoderConfig
    from transformers.models.qwen3_asr.modeling_qwen3_asr import (Qwen3ASREncoder, _get_feat_extract_output_lengths,
                                                                  get_audio_cu_seqlens)

    conf = Qwen3ASREncoderConfig(n_window=50, n_window_infer=200)
    lens = torch.tensor(lengths)
    chunks = -(-int(lens.max()) // 100)
    mask = (torch.arange(chunks * 100) < lens[:, None]).long()
    chunk_lengths = mask.view(len(lengths), chunks, 100).sum(-1).reshape(-1)
    ref_cu = get_audio_cu_seqlens(chunk_lengths, lens, 200, 50)
    post = Qwen3ASREncoder._post_cnn_length(chunk_lengths)
    ref_valid = ((torch.arange(13) < post[:, None]).flatten().nonzero().squeeze(-1))

    counts = [audio_token_count(n, 50) for n in lengths]
    assert counts == _get_feat_extract_output_lengths(lens, 50).tolist()
    cu, longest, valid = audio_windows(counts, chunks, conf, "cpu")
    assert cu.dtype == torch.int32 and cu.tolist() == ref_cu.tolist()
    assert longest == int((ref_cu[1:] - ref_cu[:-1]).max())
    assert valid.tolist() == ref_valid.tolist()


@pytest.mark.parametrize("varlen", [False, True])
def test_audio_rows_and_gradients_equal_transformers_encoder(tmp_path, varlen):
    """The model's audio path (host windows; with speed.audio_varlen one attention call a layer) against
    transformers' own encoder forward: rows and the audio tower's gradients, fp32."""
    from brisk.speed.audio_varlen import apply_audio_varlen

    _, model = tiny(tmp_path)
    speech, lengths = features(LENGTHS)
    counts = [audio_token_count(n, 50) for n in LENGTHS]
    ref = transformers_rows(model, speech, lengths)
    ref.square().sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.audio_tower.named_parameters()}
    model.zero_grad()
    if varlen:
        assert "2 audio attention layers" in apply_audio_varlen([model.audio_tower.layers])
        assert type(model.audio_tower.layers[0].self_attn).__name__.startswith("OneCall")
    rows = model.encode_audio(speech, lengths, counts)
    assert rows.shape == ref.shape == (sum(counts), ref.shape[1])
    torch.testing.assert_close(rows, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.encode_audio(speech, lengths), rows, rtol=0, atol=0)  # counts from lengths
    rows.square().sum().backward()
    grads = dict(model.audio_tower.named_parameters())
    scale = max(g.abs().max().item() for g in ref_grads.values())  # k_proj.bias: zero up to rounding (softmax)
    worst = max((grads[n].grad - g).abs().max().item() for n, g in ref_grads.items())
    assert worst < 1e-5 * scale, (worst, scale)


def test_window_attention_keeps_windows_apart():
    """speed.varlen.window_attention off CUDA: each window's rows equal an SDPA call on that window alone."""
    from brisk.speed.varlen import window_attention

    torch.manual_seed(0)
    sizes = [5, 26, 26, 1, 13]
    q, k, v = (torch.randn(sum(sizes), 3, 8) for _ in range(3))
    cu = torch.tensor([0] + sizes).cumsum(0).to(torch.int32)
    out = window_attention(q, k, v, cu, max(sizes), 0.3)
    for (a, b) in zip(cu[:-1].tolist(), cu[1:].tolist()):
        one = torch.nn.functional.scaled_dot_product_attention(*(x[a:b].transpose(0, 1) for x in (q, k, v)), scale=0.3)
        torch.testing.assert_close(out[a:b], one.transpose(0, 1), rtol=0, atol=1e-6)


def _step(tmp_path, samples, *over):
    """Loss and gradients of one training step's forward with the plan's model-side switches (CPU)."""
    from brisk.plan import make_plan
    from brisk.speed import accelerate
    from brisk.train.step import StepHooks, model_loss

    cfg, model = tiny(tmp_path, *over)
    cfg, plan = make_plan(cfg, "cpu", 1)
    accel = accelerate(model, plan)
    accel.train_mode()
    batch = Collator(packed=True, token_buckets=(1024,))(samples)
    _, loss, _, _ = model_loss(model, batch, StepHooks(audio=accel.audio, loss=accel.loss))
    loss.backward()
    return accel.notes, loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("frozen", [False, True])
def test_a_training_step_with_audio_varlen_on_equals_off(tmp_path, frozen):
    """A step's loss and gradients, speed.audio_varlen on and off; the audio tower trains, or is frozen and run
    under frozen_eval (the switch then swaps the attention that computes the rows)."""
    path, _ = recipe_jsonl(tmp_path, 4)
    over = [f"data.train={path}", "speed.packing=true"]
    if frozen:
        over += ["model.encoder.freeze=true", "model.adaptor.freeze=true", "speed.frozen_eval=true"]
    _, samples = samples_of(config(tmp_path, *over), path, 4)
    notes_off, ref_loss, ref_grads = _step(tmp_path, samples, *over)
    notes, loss, grads = _step(tmp_path, samples, *over, "speed.audio_varlen=true")
    assert not any(n.startswith("audio_varlen") for n in notes_off)
    assert any(n.startswith("audio_varlen: 2 audio attention layers") for n in notes), notes
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-5)
    assert set(grads) == set(ref_grads) and any(n.startswith("audio_tower.") for n in grads) != frozen
    worst = max((grads[n] - ref_grads[n]).abs().max().item() for n in grads)
    assert worst < 1e-5, worst


def test_frozen_bf16_copies_get_the_one_call_attention(tmp_path):
    """With encoder_dtype=bf16 the rows come from copies of the tower: the switch swaps their attention too."""
    from brisk.plan import make_plan
    from brisk.speed import accelerate

    cfg, model = tiny(tmp_path, "model.encoder.freeze=true", "model.adaptor.freeze=true", "speed.frozen_eval=true",
                      "speed.encoder_dtype=bf16", "speed.audio_varlen=true")
    accel = accelerate(model, make_plan(cfg, "cpu", 1)[1])
    copy = accel.audio.path.audio_tower
    assert copy is not model.audio_tower
    assert all(type(t.layers[0].self_attn).__name__.startswith("OneCall") for t in (copy, model.audio_tower))
    assert any("4 audio attention layers" in n for n in accel.notes)


def test_the_fast_preset_takes_audio_varlen_on_cuda_only_for_qwen3_asr(tmp_path):
    from brisk.plan import make_plan

    frozen = ("model.encoder.freeze=true", "model.adaptor.freeze=true")
    assert "audio_varlen" in make_plan(config(tmp_path, "speed.preset=fast", *frozen), "cuda", 1)[1].on
    assert "audio_varlen" not in make_plan(config(tmp_path, "speed.preset=fast", *frozen), "cpu", 1)[1].on
    with pytest.raises(ConfigError, match=r"fun_asr_nano does not take speed.audio_varlen \(model.family=qwen3_asr's\)"):
        from brisk.config import load_config

        from .conftest import REPO
        load_config(REPO / "configs" / "demo.yaml", [f"train.output_dir={tmp_path}", "speed.audio_varlen=true"])


def test_run_audio_tower_is_the_encoders_forward_for_one_utterance(tmp_path):
    """One utterance, no padding: the host path and transformers' forward give the same rows exactly."""
    _, model = tiny(tmp_path)
    speech, lengths = features([300])
    tower = model.audio_tower
    with torch.no_grad():
        feats = speech.transpose(1, 2)
        ref = tower(input_features=feats, input_features_mask=torch.ones(1, 300, dtype=torch.long)).last_hidden_state
        out = run_audio_tower(tower, feats, *audio_windows([audio_token_count(300, 50)], 3, tower.config, "cpu"))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
