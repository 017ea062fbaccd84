"""build_model: when one file holds every weight, the model is built without random init (meta) and
filled in its final dtype; the result is the same model as the seeded-init-then-load path."""

from __future__ import annotations

import torch

import brisk.families.fun_asr_nano.build as build
from brisk.families import section
from brisk.models.build import build_model

from .conftest import tiny_config


def _both(cfg, monkeypatch):
    fast = build_model(cfg)
    with monkeypatch.context() as m:
        m.setattr(build, "build_from_file", lambda *a, **k: None)  # today's path: seeded init, then load
        slow = build_model(cfg)
    return fast, slow


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    ba, bb = dict(a.named_buffers()), dict(b.named_buffers())  # non-persistent ones (rotary) included
    assert ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert all(pa[k].requires_grad == pb[k].requires_grad and pa[k].device.type != "meta" for k in pa)


def test_meta_build_from_a_full_file_equals_seeded_build_then_load(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path / "run", **{"model.encoder.freeze": True, "model.llm.dtype": "bf16",
                                           "model.seed": 7})
    src = build_model(cfg)
    torch.save({"state_dict": src.state_dict()}, tmp_path / "model.pt")
    cfg.model.init, cfg.model.seed = str(tmp_path / "model.pt"), 0  # another seed: every value from the file
    assert build.build_from_file(cfg.model, section(cfg), tmp_path / "model.pt") is not None  # the meta path
    fast, slow = _both(cfg, monkeypatch)
    assert any("inv_freq" in k for k, _ in fast.named_buffers())
    _same(fast, slow)
    _same(fast, src)
    llm = fast.llm
    if llm.config.tie_word_embeddings:
        assert llm.get_output_embeddings().weight is llm.get_input_embeddings().weight


def test_file_missing_a_weight_takes_the_seeded_path(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path / "run")
    src = build_model(cfg)
    state = src.state_dict()
    state = {k: v for k, v in state.items() if not k.startswith("audio_encoder.")}
    torch.save({"state_dict": state}, tmp_path / "part.pt")
    assert build.build_from_file(cfg.model, section(cfg), tmp_path / "part.pt") is None
