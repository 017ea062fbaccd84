"""Speed switches on the CPU: with defaults nothing is touched; with a switch on, it acts where it should
and nowhere else. (CUDA-only paths are checked on the GPU by tests/gpu/ and bench/gpu_checks.py;
results in bench/results/.)"""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError
from brisk.data.collate import Collator, collator_for
from brisk.data.loader import build_split
from brisk.models.build import build_model
from brisk.speed.compile import compile_counters
from brisk.speed.flags import backend_flags, run_scope, tf32_scope
from brisk.train.optim import WarmupLR, build_optimizer
from brisk.train.step import StepHooks, TrainStep

from .conftest import speed_parts, tiny_config

CPU = torch.device("cpu")


def _setup(tmp_path, **extra):
    cfg = tiny_config(tmp_path, **extra)
    model = build_model(cfg).train()
    cfg, plan, parts = speed_parts(model, cfg)
    parts.train_mode()
    opt = build_optimizer(model, cfg.optim, fused=plan.fused_adamw)
    step = TrainStep(model, opt, WarmupLR(opt, cfg.optim.lr, 10), grad_clip=5.0, on_device_skip=plan.on_device_skip,
                     hooks=StepHooks(audio=parts.audio))
    collator = collator_for(cfg)
    split = build_split(cfg, "train", collator, 483)
    batches = [collator([split.dataset[(i, 0)] for i in idx]) for idx in split.sampler.batches(0)[:3]]
    return cfg, model, parts, opt, step, batches


def _replaced_forwards(model):
    """Modules with an instance attribute shadowing one of their methods: what no switch may leave behind."""
    return [name for name, m in model.named_modules()
            if any(k in m.__dict__ for k in ("forward", "train", "eval", "__call__", "_call_impl"))]


def test_defaults_touch_nothing(tmp_path):
    flags = backend_flags()
    cfg, model, plan, opt, step, batches = _setup(tmp_path)
    assert plan.notes == [] and plan.audio is None and plan.loss is None and collator_for(cfg) == Collator()
    assert _replaced_forwards(model) == []
    assert model.llm.config._attn_implementation == "sdpa"
    assert not any(g.get("fused") for g in opt.param_groups)
    for b in batches:
        step([b])
    assert backend_flags() == flags


def test_sdpa_backends_scoped_to_the_run(tmp_path):
    seen = []
    flags = backend_flags()
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **{"speed.sdpa_backends": ["math"]})
    model.llm.register_forward_pre_hook(lambda *a: seen.append(backend_flags()))
    step([batches[0]])
    assert seen and seen[-1]["sdp.flash"]  # outside the run's scope: torch's own selection
    with run_scope(cfg):
        step([batches[0]])
    assert seen[-1]["sdp.math"] and not seen[-1]["sdp.flash"] and not seen[-1]["sdp.mem_efficient"]
    assert not seen[-1]["sdp.cudnn"]
    assert backend_flags() == flags  # restored on exit
    assert _replaced_forwards(model) == []  # a scope, not a model change


def test_tf32_scope_restores_flags():
    flags = backend_flags()
    with tf32_scope(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "high"
    assert backend_flags() == flags


def test_run_scope_holds_every_flag_of_the_plan_and_restores_them(tmp_path):
    import torch._dynamo

    cfg = tiny_config(tmp_path, **{"speed.tf32": True, "speed.sdpa_backends": ["efficient", "math"],
                                   "speed.compile": True})
    flags, suppress = backend_flags(), torch._dynamo.config.suppress_errors
    with run_scope(cfg):
        inside = backend_flags()
        assert torch._dynamo.config.suppress_errors  # compile_on_error=warn: eager where a compile fails
    assert inside["matmul.allow_tf32"] and inside["float32_matmul_precision"] == "high"
    assert inside["sdp.mem_efficient"] and inside["sdp.math"] and not inside["sdp.flash"]
    assert backend_flags() == flags and torch._dynamo.config.suppress_errors == suppress


@pytest.mark.parametrize("deterministic", [True, False])
def test_train_deterministic_sets_cudnn_for_the_run_and_restores_it(tmp_path, deterministic):
    cfg = tiny_config(tmp_path, **{"train.deterministic": deterministic})
    flags = backend_flags()
    assert not flags["cudnn.deterministic"]  # torch's default
    with run_scope(cfg):
        assert torch.backends.cudnn.deterministic is deterministic
    assert backend_flags() == flags


@pytest.mark.parametrize("dynamic", [True, False])
def test_static_layers_get_a_recompile_limit_with_room_for_every_bucket(tmp_path, dynamic):
    """compile_dynamic=false compiles a layer graph a row length: 15 buckets would pass Dynamo's 8, and the 9th
    length would run the layer eagerly. The scope makes room for every bucket and 8 longer rows, then restores."""
    import torch._dynamo

    buckets = [256 * (i + 1) for i in range(15)]
    graphed = {"speed.packing": True, "speed.cuda_graph": True, "speed.frozen_eval": True,
               "model.encoder.freeze": True, "model.adaptor.freeze": True}
    cfg = tiny_config(tmp_path, **{"speed.compile": True, "speed.compile_dynamic": dynamic,
                                   "speed.pack_buckets": buckets, **graphed})
    before = torch._dynamo.config.recompile_limit
    with run_scope(cfg):
        inside = torch._dynamo.config.recompile_limit
    assert inside == (before if dynamic else max(before, 23))
    assert torch._dynamo.config.recompile_limit == before
    if not dynamic:  # plain packed batches would make nearly every batch a shape of its own
        with pytest.raises(ConfigError, match="compile_dynamic=false .* only under speed.cuda_graph"):
            tiny_config(tmp_path, **{"speed.compile": True, "speed.compile_dynamic": False})


def test_compile_compiles_nothing_on_the_cpu(tmp_path):
    before = compile_counters()
    cfg, model, parts, opt, step, batches = _setup(tmp_path, **{"speed.compile": True})
    assert any("nothing compiled on cpu" in n for n in parts.notes)
    assert _replaced_forwards(model) == []
    assert not any(getattr(m, "_compiled_call_impl", None) for m in model.modules())
    step([batches[0]])
    assert compile_counters() == before  # Dynamo never ran


def test_compile_on_cuda_compiles_modules_in_place(tmp_path):
    """What the switch does to the module tree on a CUDA device (the compiled code runs in tests/gpu): each
    decoder layer and frozen encoder block compiled with nn.Module.compile, keys and forwards unchanged."""
    from brisk.plan import make_plan
    from brisk.speed.compile import apply_compile

    cfg = tiny_config(tmp_path, **{"speed.compile": True, "speed.frozen_eval": True, "model.encoder.freeze": True,
                                   "model.adaptor.freeze": True, "speed.inductor_cache_dir": str(tmp_path / "ind")})
    model = build_model(cfg)
    keys = set(model.state_dict())
    apply_compile(model, make_plan(cfg, "cuda")[1].speed, "cuda")
    compiled = {n for n, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None}
    layers = {f"llm.model.layers.{i}" for i in range(len(model.llm.model.layers))}
    assert layers <= compiled and any(n.startswith("audio_encoder.encoders.") for n in compiled)
    assert "audio_encoder.encoders0.0" not in compiled  # the 560-wide first block stays eager
    assert set(model.state_dict()) == keys and _replaced_forwards(model) == []


def test_compiled_modules_run_eagerly_under_the_eval_context(tmp_path):
    from brisk.speed.compile import eval_context

    cfg = tiny_config(tmp_path, **{"speed.compile": True})
    f = torch.nn.Linear(3, 3)
    f.compile(backend="eager")
    before = compile_counters()["graphs"]
    with eval_context(cfg.speed)():
        f(torch.randn(2, 3))
    assert compile_counters()["graphs"] == before  # force_eager: Dynamo did not compile


def test_fused_adamw_and_on_device_skip(tmp_path):
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **{"speed.fused_adamw": True})
    assert all(g["fused"] for g in opt.param_groups) and step.on_device_skip
    out = step([batches[0]])
    assert out["skipped"].item() == 0


def test_frozen_eval_keeps_eval_and_drops_autograd(tmp_path):
    extra = {"speed.frozen_eval": True, "model.encoder.freeze": True, "model.adaptor.freeze": True}
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **extra)
    model.eval()
    plan.train_mode()  # what the loop calls for training mode
    assert _replaced_forwards(model) == []
    assert not model.audio_encoder.training and not model.audio_adaptor.training and model.llm.training
    rows = plan.audio(batches[0])
    assert not rows.requires_grad
    ref = build_model(cfg)
    ref.load_state_dict(model.state_dict())
    ref.audio_encoder.eval()
    ref.audio_adaptor.eval()
    with torch.no_grad():
        assert torch.equal(rows, ref.audio_rows(batches[0]))  # the same rows, no dropout


def test_encoder_cache_reuses_rows(tmp_path):
    extra = {"speed.frozen_eval": True, "speed.encoder_cache": True, "model.encoder.freeze": True,
             "model.adaptor.freeze": True, "fun_asr_nano.frontend.dither": 0.0}
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **extra)
    first = plan.audio(batches[0])
    assert plan.audio.misses == len(batches[0].keys) and plan.audio.hits == 0
    again = plan.audio(batches[0])
    assert plan.audio.hits == len(batches[0].keys) and torch.equal(first, again)


def test_packing_on_cpu_keeps_sdpa_with_a_block_mask(tmp_path):
    cfg, model, plan, opt, step, batches = _setup(tmp_path, **{"speed.packing": True})
    assert collator_for(cfg).packed and batches[0].input_ids.shape[0] == 1
    assert model.llm.config._attn_implementation == "sdpa"
    assert torch.isfinite(step([batches[0]])["loss"])


def test_cuda_only_switches_refuse_the_cpu(tmp_path):
    frozen = {"model.encoder.freeze": True, "model.adaptor.freeze": True}
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        _setup(tmp_path, **{"speed.packing": True, "speed.cuda_graph": True, "speed.frozen_eval": True, **frozen})
    with pytest.raises(ConfigError, match="encoder_dtype=bf16 needs speed.frozen_eval"):
        tiny_config(tmp_path, **{"speed.encoder_dtype": "bf16"})  # at load time: before any model exists
