"""Qwen3-ASR's audio tower in shapes fixed per step bucket (what speed.cuda_graph captures under
speed.audio_varlen, brisk.speed.graph.GraphedAudioInputs), on the CPU: the static inputs' shapes depend on the
bucket alone, and the rows computed from them (one masked SDPA call on padded windows, zero-length windows at
the end) equal the eager tower's on the real slots and are zero on the others. The graphs themselves:
tests/gpu/test_qwen3_asr_static_audio_cuda.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from brisk.config import SpeedConfig
from brisk.data.collate import collator_for
from brisk.families import family_of, get
from brisk.families.qwen3_asr.model import _window, static_windows
from brisk.speed.audio_varlen import apply_audio_varlen
from brisk.speed.frozen import FrozenAudio

from .test_qwen3_asr import config, recipe_jsonl, samples_of
from .test_qwen3_asr_graph import GRAPH


class _Cfg:  # the audio config fields the windows read (Qwen3-ASR-0.6B's: 13 rows a chunk, 104 a full window)
    n_window, n_window_infer = 50, 800


@pytest.mark.parametrize("counts", [[], [3], [5, 9], [13, 104, 105, 1], [250, 7, 40]])
def test_static_windows_cover_the_real_windows_then_the_padding_in_a_fixed_count(counts):
    from brisk.families.qwen3_asr.model import audio_windows

    slots, room = 512, 6
    cu = static_windows(counts, slots, room, _Cfg)
    full = _window([], _Cfg, full=True)
    assert full == 104 and cu.dtype == torch.int32
    assert cu.numel() == 2 * -(-slots // full) + room + 2  # fixed by (slots, room): one graph shape
    real, longest, _ = audio_windows(counts, 4, _Cfg, "cpu")  # the eager windows
    assert torch.equal(cu[: real.numel()], real)  # the same real windows first
    sizes = (cu[1:] - cu[:-1]).tolist()
    assert cu[-1] == slots and min(sizes) >= 0 and max(sizes) <= full and longest <= full
    assert sizes[-1] == 0  # at least one zero-length window: the padding rule is exercised
    with pytest.raises(ValueError, match="do not fit"):
        static_windows([1] * 7, slots, room, _Cfg)


def test_the_family_graphs_the_tower_from_static_inputs_only_under_audio_varlen():
    assert get("qwen3_asr").audio_static_inputs(SpeedConfig(audio_varlen=True))
    assert not get("qwen3_asr").audio_static_inputs(SpeedConfig(audio_varlen=False))
    assert not get("fun_asr_nano").audio_static_inputs(SpeedConfig(audio_varlen=True))


@pytest.mark.parametrize("copy", [False, True])
def test_static_rows_equal_the_eager_rows_on_the_real_slots(tmp_path, copy):
    """fp32 on the CPU, the tower's attention swapped for the one-call windows (masked SDPA on padded windows):
    two groups of one bucket have the same key and input shapes, and each one's static rows are its eager rows,
    then zeros. ``copy``: through the frozen provider's copies (AudioPath), as the graphed step calls them."""
    n = 6
    path, _ = recipe_jsonl(tmp_path, n)
    cfg = config(tmp_path, *GRAPH, f"data.train={path}", "speed.pack_buckets=[4096]")
    _, samples = samples_of(cfg, path, n)
    model = family_of(cfg).build(cfg, "cpu").eval()
    apply_audio_varlen([model.audio_tower.layers])
    # copy: float64 copies of the swapped modules (the provider's path, AudioPath), compared at fp32's precision
    audio_path = FrozenAudio(model, torch.float64 if copy else torch.float32,
                             names=family_of(cfg).audio_path).path
    collate = collator_for(cfg)
    shapes = set()
    for group in (samples, samples[1:4], samples[5:]):
        batch = collate(group)
        with torch.no_grad():
            ref = model.audio_rows(batch)
            speech = batch.speech.to(torch.float64) if copy else batch.speech
            key, inputs = audio_path.static_audio_inputs(dataclasses.replace(batch, speech=speech))
            rows = audio_path.static_audio_rows(*inputs)
        shapes.add((key, tuple(tuple(x.shape) for x in inputs)))
        real = sum(batch.slot_counts)
        assert 0 < real < rows.shape[0] == ref.shape[0] == batch.audio_pos.numel()
        torch.testing.assert_close(rows[:real].float(), ref[:real], rtol=1e-4, atol=1e-5)
        assert rows[real:].abs().sum() == 0
        slots, places = key
        chunks = sum(-(-c // 13) for c in batch.slot_counts)
        assert inputs[0].shape[0] == places >= chunks and slots == batch.audio_pos.numel()
    assert len(shapes) == 1, shapes


def test_a_step_that_runs_eagerly_takes_its_audio_rows_from_the_eager_provider(monkeypatch):
    """GraphedStep (built without CUDA here: only its call's routing is under test): a padded-layout batch, which
    no step graph takes, gets its rows from the plain provider, so no audio graph is captured for a one-off
    shape; a packed batch of a captured bucket gets them from the graphed provider."""
    from types import SimpleNamespace

    from brisk.speed.graph import GraphedStep

    calls, bodies = [], []
    step = SimpleNamespace(hooks=SimpleNamespace(loss=None, mark=lambda name: None), advance=lambda m: None,
                           body=lambda batches, rows: bodies.append(rows[0]) or {"loss": torch.zeros(())})
    graphed = GraphedStep.__new__(GraphedStep)  # __init__ needs CUDA (graph pools)
    graphed.step, graphed.fresh, graphed.graphs, graphed.eager_fallbacks = step, False, {}, 0
    graphed.trained = None  # the audio is frozen
    graphed.plain_audio = lambda b: calls.append("eager") or torch.ones(2, 3)
    graphed.audio = lambda b: calls.append("graphed") or torch.zeros(2, 3)
    padded = SimpleNamespace(input_ids=torch.zeros(1, 16, dtype=torch.long), layout="padded")
    graphed([padded])
    assert calls == ["eager"] and graphed.eager_fallbacks == 1 and torch.equal(bodies[0], torch.ones(2, 3))
    cap = SimpleNamespace(batch=None, audio=(torch.empty(2, 3),), graph=SimpleNamespace(replay=lambda: None),
                          out={"loss": torch.zeros(())})
    graphed.graphs[16] = cap
    packed = SimpleNamespace(input_ids=torch.zeros(1, 16, dtype=torch.long), layout="packed")
    monkeypatch.setattr("brisk.speed.graph._copy_into", lambda dst, src: None)  # no static batch here
    graphed([packed])
    assert calls == ["eager", "graphed"] and torch.equal(cap.audio[0], torch.zeros(2, 3))
