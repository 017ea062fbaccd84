"""Speed switches on the CPU: with defaults nothing is touched; with a switch on, it acts where it should
and nowhere else. (CUDA-only paths are checked on the GPU by tests/gpu/ and bench/gpu_checks.py;
results in bench/results/.)"""

from __future__ import annotations

import logging

import pytest
import torch

from brisk.config import ConfigError
from brisk.data.collate import Collator
from brisk.data.loader import build_split
from brisk.models.build import build_model
from brisk.speed import apply_speed
from brisk.speed.compile import CudaOnlyCompiled, compile_counters
from brisk.speed.flags import backend_flags, tf32_scope
from brisk.train.optim import WarmupLR, build_optimizer
from brisk.train.step import StepHooks, TrainStep

from .conftest import tiny_config

CPU = torch.device("cpu")


def _setup(tmp_path, **extra):
    cfg = tiny_config(tmp_path, **extra)
    model = build_model(cfg.model).train()
    plan = apply_speed(model, cfg, CPU)
    opt = build_optimizer(model, cfg.optim, fused=plan.fused_adamw)
    step = TrainStep(model, opt, WarmupLR(opt, cfg.optim.lr, 10), grad_clip=5.0, on_device_skip=plan.on_device_skip,
                     hooks=StepHooks(context=plan.context, audio=plan.audio))
    split = build_split(cfg, "train", plan.collator, 483)
    batches = [plan.collator([split.dataset[(i, 0)] for i in idx]) for idx in split.sampler.batches(0)[:3]]
    return cfg, model, plan, opt, step, batches


def _replaced_forwards(model):
    return [name for name, m in model.named_modules() if "forward" in m.__dict__ or "train" in m.__dict__]


def test_defaults_touch_nothing(tmp_path):
    flags = backend_flags()
    cfg, model, plan, opt, step, batches = _setup(tmp_path)
    assert plan.notes == [] and plan.audio is None and plan.collator == Collator()
    assert _replaced_forwards(model) == []
    assert model.llm.config._attn_implementation == "sdpa"
    assert not any(g.get("fused") for g in opt.param_groups)
    for b in batches:
        step([b])
    assert backend_flags() == flags


def test_sdpa_backends_scoped_to_the_step(tmp_path):
    seen = []
    flags = backend_flags()
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **{"speed.sdpa_backends": ["math"]})
    model.llm.register_forward_pre_hook(lambda *a: seen.append(backend_flags()))
    step([batches[0]])
    assert seen and seen[0]["sdp.math"] and not seen[0]["sdp.flash"] and not seen[0]["sdp.mem_efficient"]
    assert not seen[0]["sdp.cudnn"]
    assert backend_flags() == flags  # restored on return
    assert _replaced_forwards(model) == []  # a scope, not a model change


def test_tf32_scope_restores_flags():
    flags = backend_flags()
    with tf32_scope(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "high"
    assert backend_flags() == flags


def test_compile_wraps_decoder_layers_and_stays_eager_on_cpu(tmp_path):
    before = compile_counters()
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **{"speed.compile": True})
    layers = {f"llm.model.layers.{i}" for i in range(len(model.llm.model.layers))}
    assert set(_replaced_forwards(model)) == layers  # the decoder layers, nothing else
    assert set(model.state_dict()) == set(build_model(cfg.model).state_dict())  # keys unchanged
    step([batches[0]])
    assert compile_counters() == before  # CPU inputs: Dynamo never ran


def test_compile_with_frozen_eval_also_covers_the_frozen_encoder(tmp_path):
    cfg, model, plan, *_ = _setup(tmp_path, **{"speed.compile": True, "speed.frozen_eval": True,
                                                "model.encoder.freeze": True, "model.adaptor.freeze": True})
    compiled = [n for n, m in model.named_modules() if isinstance(m.__dict__.get("forward"), CudaOnlyCompiled)]
    assert any(n.startswith("audio_encoder.") for n in compiled) and any(n.startswith("llm.") for n in compiled)


def test_compile_failure_falls_back_to_eager_with_a_warning(caplog, monkeypatch):
    import brisk.speed.compile as comp

    monkeypatch.setattr(comp, "_first_tensor", lambda args, kwargs: args[0])  # let a stand-in pass as a CUDA tensor

    class FakeCuda:
        is_cuda = True
        shape = (2, 5)
        _base = None  # not a view

        def dim(self):
            return 2

    wrapper = CudaOnlyCompiled(lambda x: "eager", "decoder layer", None, "warn")
    wrapper.compiled = lambda x: (_ for _ in ()).throw(RuntimeError("inductor exploded"))
    with caplog.at_level(logging.WARNING, logger="brisk"):
        assert wrapper(FakeCuda()) == "eager"
    assert wrapper.failed and "falling back to eager" in caplog.text
    strict = CudaOnlyCompiled(lambda x: "eager", "decoder layer", None, "raise")
    strict.compiled = wrapper.compiled
    with pytest.raises(RuntimeError, match="inductor exploded"):
        strict(FakeCuda())


def test_fused_adamw_and_on_device_skip(tmp_path):
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **{"speed.fused_adamw": True})
    assert all(g["fused"] for g in opt.param_groups) and plan.on_device_skip
    out = step([batches[0]])
    assert out["skipped"].item() == 0


def test_frozen_eval_pins_eval_and_drops_autograd(tmp_path):
    extra = {"speed.frozen_eval": True, "model.encoder.freeze": True, "model.adaptor.freeze": True}
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **extra)
    model.train()
    assert not model.audio_encoder.training and not model.audio_adaptor.training and model.llm.training
    rows = plan.audio(batches[0])
    assert not rows.requires_grad
    ref = build_model(cfg.model)
    ref.load_state_dict(model.state_dict())
    ref.audio_encoder.eval()
    ref.audio_adaptor.eval()
    with torch.no_grad():
        assert torch.equal(rows, ref.audio_rows(batches[0]))  # the same rows, no dropout


def test_encoder_cache_reuses_rows(tmp_path):
    extra = {"speed.frozen_eval": True, "speed.encoder_cache": True, "model.encoder.freeze": True,
             "model.adaptor.freeze": True, "model.frontend.dither": 0.0}
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **extra)
    first = plan.audio(batches[0])
    assert plan.audio.misses == len(batches[0].keys) and plan.audio.hits == 0
    again = plan.audio(batches[0])
    assert plan.audio.hits == len(batches[0].keys) and torch.equal(first, again)


def test_packing_on_cpu_keeps_sdpa_with_a_block_mask(tmp_path):
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **{"speed.packing": True})
    assert plan.collator.packed and batches[0].input_ids.shape[0] == 1
    assert model.llm.config._attn_implementation == "sdpa"
    assert torch.isfinite(step([batches[0]])["loss"])


def test_cuda_only_switches_refuse_the_cpu(tmp_path):
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        _setup(tmp_path, **{"speed.packing": True, "speed.cuda_graph": True, "speed.frozen_eval": True})
    with pytest.raises(ConfigError, match="encoder_dtype=bf16 needs speed.frozen_eval"):
        _setup(tmp_path, **{"speed.encoder_dtype": "bf16"})
