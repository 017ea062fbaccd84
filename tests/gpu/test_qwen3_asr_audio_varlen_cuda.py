"""speed.audio_varlen on CUDA (skipped without CUDA; transformers >= 5.24): Qwen3-ASR's audio tower in bf16 with
one varlen_attn call a layer against transformers' per-window attention, no host sync in the tower, and the
compiled encoder blocks (as speed.compile compiles them) without graph breaks or a new graph for new lengths.

    python -m pytest tests/gpu/test_qwen3_asr_audio_varlen_cuda.py -q
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
BATCHES = ([345, 120, 77, 250, 99, 200, 3], [810, 400, 60], [1600, 1000, 1001, 230, 130, 100, 55, 5])


def tiny(tmp_path):
    from brisk.config import load_config
    from brisk.families import family_of

    cfg = load_config(ROOT / "configs" / "qwen3_asr_demo.yaml", [f"train.output_dir={tmp_path}", "data.num_workers=0"])
    cfg.model.llm.config["audio_config"]["n_window_infer"] = 200  # windows of 2 chunks: several an utterance
    return family_of(cfg).build(cfg, "cuda")


def batch(lengths, seed=0):
    from brisk.families.qwen3_asr.model import audio_token_count

    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    frames = int(lens.max())
    speech = torch.randn(len(lengths), frames, 128, generator=g) * (torch.arange(frames)[None, :, None] < lens[:, None, None])
    return speech.cuda(), lens.cuda(), [audio_token_count(n, 50) for n in lengths]


def transformers_rows(model, speech, lengths):
    pad = -speech.shape[1] % 100
    feats = torch.nn.functional.pad(speech, (0, 0, 0, pad)).transpose(1, 2)
    mask = (torch.arange(feats.shape[-1], device=speech.device) < lengths[:, None]).long()
    dtype = next(model.audio_tower.parameters()).dtype
    hidden = model.audio_tower(input_features=feats.to(dtype), input_features_mask=mask).last_hidden_state
    return model.multi_modal_projector(hidden)


@torch.no_grad()
def test_bf16_rows_match_transformers_within_bf16_noise(tmp_path):
    from brisk.speed.audio_varlen import apply_audio_varlen

    model = tiny(tmp_path)
    speech, lengths, counts = batch(BATCHES[0])
    ref32 = transformers_rows(model, speech, lengths).float()
    model.audio_tower.bfloat16()
    model.multi_modal_projector.bfloat16()
    theirs = transformers_rows(model, speech, lengths).float()
    apply_audio_varlen([model.audio_tower.layers])
    ours = model.encode_audio(speech, lengths, counts).float()
    scale = ref32.abs().max()
    err_ours, err_theirs = (ours - ref32).abs().max(), (theirs - ref32).abs().max()
    assert ours.shape == ref32.shape
    assert (ours - theirs).abs().max() < 0.03 * scale
    assert err_ours < 2 * err_theirs + 1e-3 * scale, (err_ours, err_theirs)


@torch.no_grad()
def test_no_host_sync_in_the_tower_with_the_switch(tmp_path):
    """Under torch.cuda.set_sync_debug_mode("error") the audio path with the switch runs; transformers' own
    attention (lengths.tolist() in each layer) does not, which shows the check can fail."""
    from brisk.speed.audio_varlen import apply_audio_varlen

    model = tiny(tmp_path).to(torch.bfloat16)
    speech, lengths, counts = batch(BATCHES[0])
    speech = speech.bfloat16()
    plain = copy.deepcopy(model)
    plain.encode_audio(speech, lengths, counts)  # warm-up: lazy initialisation, pinned memory
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError):
        try:
            torch.cuda.set_sync_debug_mode("error")
            plain.encode_audio(speech, lengths, counts)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    apply_audio_varlen([model.audio_tower.layers])
    model.encode_audio(speech, lengths, counts)
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        rows = model.encode_audio(speech, lengths, counts)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert rows.shape[0] == sum(counts)


@torch.no_grad()
def test_compiled_blocks_take_new_lengths_without_a_new_graph(tmp_path, monkeypatch):
    """The encoder blocks compiled as speed.compile does (dynamic=True) over batches of other lengths and window
    counts: no graph break, one graph after the first batch, rows equal to the eager ones within bf16 noise."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from brisk.speed.audio_varlen import apply_audio_varlen

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ind"))
    torch._dynamo.reset()
    counters.clear()
    model = tiny(tmp_path).to(torch.bfloat16)
    apply_audio_varlen([model.audio_tower.layers])
    eager = copy.deepcopy(model)
    for layer in model.audio_tower.layers:
        layer.compile(dynamic=True)
    graphs = None
    for i, lengths in enumerate(BATCHES):
        speech, lens, counts = batch(lengths, seed=i)
        speech = speech.bfloat16()
        rows, ref = model.encode_audio(speech, lens, counts).float(), eager.encode_audio(speech, lens, counts).float()
        assert (rows - ref).abs().max() < 0.03 * ref.abs().max()
        if graphs is None:
            graphs = counters["stats"]["unique_graphs"]
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == graphs, (graphs, dict(counters["stats"]))
    assert not sum(counters["recompiles"].values()), dict(counters["recompiles"])
