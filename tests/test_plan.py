"""The speed plan (brisk/plan.py): every rule fires at load time or for the device, with one line naming the
keys; presets are written out before the dataclasses exist, single keys win over them, and on a device without
CUDA the GPU-only switches stay off and are named."""

from __future__ import annotations

import dataclasses

import pytest

from brisk.config import ConfigError, SpeedConfig
from brisk.plan import presets, RULES, SWITCH_KEYS, make_plan, switches_on

from .conftest import tiny_config

FROZEN = {"model.encoder.freeze": True, "model.adaptor.freeze": True}


def test_every_switch_is_a_speed_key_and_defaults_are_off():
    fields = {f.name for f in dataclasses.fields(SpeedConfig)}
    assert set(SWITCH_KEYS) <= fields
    assert switches_on(SpeedConfig()) == []
    assert all(set(values) <= fields for tasks in presets().values() for values in tasks.values())
    assert all(r.when in ("config", "device", "ranks") for r in RULES)


@pytest.mark.parametrize("extra, message", [
    ({"speed.cuda_graph": True}, "speed.cuda_graph needs speed.packing"),
    ({"speed.cuda_graph": True, "speed.packing": True, **FROZEN}, "speed.cuda_graph needs speed.frozen_eval"),
    ({"speed.cuda_graph": True, "speed.packing": True, "model.encoder.activation_checkpoint": 1},
     "cannot hold the training encoder's activation checkpointing"),
    ({"speed.cuda_graph": True, "speed.packing": True, "speed.frozen_eval": True, "train.accum_grad": 2, **FROZEN},
     "does not support train.accum_grad"),
    ({"speed.frozen_eval": True}, "needs model.encoder.freeze=true"),
    ({"speed.encoder_cache": True}, "encoder_cache needs speed.frozen_eval"),
    ({"speed.fuse_projections": True, "train.parallel": "fsdp"}, "fuse_projections with train.parallel=fsdp"),
])
def test_config_rules_fire_at_load_time(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message) as e:
        tiny_config(tmp_path, **extra)
    assert "\n" not in str(e.value)


def test_device_and_rank_rules_fire_in_make_plan(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.cuda_graph": True, "speed.packing": True, "speed.frozen_eval": True, **FROZEN})
    make_plan(cfg, "cuda", 1)
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        make_plan(cfg, "cpu", 1)
    with pytest.raises(ConfigError, match="train.parallel=fsdp with speed.cuda_graph"):
        make_plan(tiny_config(tmp_path, **{"speed.cuda_graph": True, "speed.packing": True, "speed.frozen_eval": True,
                                           "train.parallel": "fsdp", **FROZEN}), "cuda", 2)
    with pytest.raises(ConfigError, match="train.parallel=fsdp runs the eager step"):
        make_plan(tiny_config(tmp_path, **{"speed.compile": True, "train.parallel": "fsdp"}), "cuda", 2)


def test_the_fast_preset_on_a_gpu_is_the_whole_set(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.preset": "fast", **FROZEN})
    cfg, plan = make_plan(cfg, "cuda", 1)
    assert set(plan.on) == {"packing", "cuda_graph", "frozen_eval", "encoder_dtype", "compile", "fused_adamw",
                            "label_head", "fresh_grads", "fuse_projections", "flex_attention"}
    assert cfg.speed.label_rows_frac == presets()["fast"]["fun_asr_nano"]["label_rows_frac"]
    assert cfg.speed.compile_dynamic is False and cfg.speed.graph_capture == "seen"
    assert not plan.persistent_grads and plan.on_device_skip and plan.capturable
    assert plan.notes and plan.notes[0].startswith("preset fast: on ")


def test_the_fast_preset_on_the_cpu_leaves_gpu_switches_off_and_says_so(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.preset": "fast", **FROZEN})
    assert cfg.speed.cuda_graph  # written out at load time; the device is not known yet
    cfg, plan = make_plan(cfg, "cpu", 1)
    assert set(plan.on) == {"frozen_eval", "packing", "label_head"}
    assert not cfg.speed.cuda_graph and not cfg.speed.compile and cfg.speed.encoder_dtype == "fp32"
    note = plan.notes[0]
    for key in ("cuda_graph", "compile", "fused_adamw", "encoder_dtype", "fresh_grads", "fuse_projections",
                "flex_attention"):
        assert f"left off {key} (needs CUDA)" in note


def test_the_preset_without_a_frozen_encoder_leaves_the_frozen_audio_switches_off(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.preset": "fast"})  # the demo trains its encoder and adaptor
    assert not cfg.speed.frozen_eval and not cfg.speed.cuda_graph and cfg.speed.packing
    cfg, plan = make_plan(cfg, "cuda", 1)
    assert "frozen_eval" not in plan.on and "compile" in plan.on
    assert any("frozen-audio switches" in n for n in plan.notes)


@pytest.mark.parametrize("given, left_out", [
    ({"speed.compile": False}, {"flex_attention"}),
    ({"speed.cuda_graph": False}, {"compile_dynamic", "graph_capture", "fresh_grads", "flex_attention"}),
    ({"speed.compile_dynamic": True}, {"flex_attention", "compile_dynamic"}),  # given: the config's own value
    ({"model.llm.activation_checkpoint": 2}, {"flex_attention"}),
    ({"speed.compile_scope": "stack"}, {"flex_attention"}),
    ({"model.llm.lora.enabled": True}, {"flex_attention", "compile_dynamic"}),  # untested with adapters
    ({"model.encoder.freeze": False}, {"compile_dynamic", "graph_capture", "fresh_grads", "flex_attention"}),  # drops
])  # (the last: the preset itself leaves cuda_graph out for a trained encoder)
def test_the_preset_leaves_out_what_a_setting_of_the_config_rules_out(tmp_path, given, left_out):
    """A preset value that needs a setting the config turns off is left out, instead of a refusal about a
    switch the user never named; the rest of the preset stays."""
    frozen = {k: v for k, v in FROZEN.items() if k not in given}
    cfg = tiny_config(tmp_path, **{"speed.preset": "fast", **frozen, **given})
    full = {"flex_attention": True, "compile_dynamic": False, "graph_capture": "seen", "fresh_grads": True}
    for key, value in full.items():
        assert (getattr(cfg.speed, key) == value) == (key not in left_out), key
    make_plan(cfg, "cuda", 1)  # no rule broken


def test_preset_needs_name_real_keys_with_their_real_defaults():
    """PRESET_NEEDS restates a few rules with each key's default: the defaults must stay the dataclasses' own."""
    from brisk.config import LLMConfig
    from brisk.plan import PRESET_NEEDS

    section = {"speed": SpeedConfig(), "llm": LLMConfig()}
    for key, needs in PRESET_NEEDS.items():
        assert key in {f.name for f in dataclasses.fields(SpeedConfig)}, key
        for part, name, need, default in needs:
            assert getattr(section[part], name) == default, (key, part, name)


def test_the_cpu_plan_note_leaves_out_settings_that_do_nothing_there(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.preset": "fast", **FROZEN})
    _, plan = make_plan(cfg, "cpu", 1)
    assert "compile_dynamic" not in plan.notes[0] and "graph_capture" not in plan.notes[0]
    _, plan = make_plan(cfg, "cuda", 1)
    assert "compile_dynamic=False" in plan.notes[0] and "graph_capture=seen" in plan.notes[0]


def test_single_keys_win_over_the_preset(tmp_path):
    cfg = tiny_config(tmp_path, **{"speed.preset": "fast", "speed.label_head": False, "speed.label_rows_frac": 0.5,
                                   "speed.fresh_grads": False, **FROZEN})
    assert cfg.speed.label_head is False and cfg.speed.label_rows_frac == 0.5 and not cfg.speed.fresh_grads
    _, plan = make_plan(cfg, "cuda", 1)
    assert "label_head" not in plan.on and "fresh_grads" not in plan.on and plan.persistent_grads


def test_the_preset_trims_to_several_ranks(tmp_path):
    cfg, plan = make_plan(tiny_config(tmp_path, **{"speed.preset": "fast", "train.parallel": "fsdp", "train.val_decode": 0, **FROZEN}), "cuda", 2)
    assert "cuda_graph" not in plan.on and "compile" not in plan.on and "packing" in plan.on
    assert "left off cuda_graph (not with train.parallel=fsdp)" in plan.notes[0]


def test_several_ranks_capture_ahead(tmp_path):
    """A lazily captured graph holds the gradient all-reduce, so ranks must capture together: the preset's
    graph_capture=seen falls back to ahead with several ranks, and an explicit seen is refused."""
    cfg = tiny_config(tmp_path, **{"speed.preset": "fast", **FROZEN})
    eff, plan = make_plan(cfg, "cuda", 2)
    assert eff.speed.graph_capture == "ahead" and "cuda_graph" in plan.on
    assert "left off graph_capture (not with 2 ranks)" in plan.notes[0]
    graphed = {"speed.packing": True, "speed.frozen_eval": True, "speed.cuda_graph": True, **FROZEN}
    with pytest.raises(ConfigError, match="speed.graph_capture=seen with 2 ranks"):
        make_plan(tiny_config(tmp_path, **{**graphed, "speed.graph_capture": "seen"}), "cuda", 2)
    make_plan(tiny_config(tmp_path, **{**graphed, "speed.graph_capture": "seen"}), "cuda", 1)


def test_a_wrong_preset_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"speed.preset='fastest': use one of fast"):
        tiny_config(tmp_path, **{"speed.preset": "fastest"})


def test_the_acceleration_line_and_accel_json_name_the_preset(tmp_path):
    import torch

    from brisk.diagnose.accel import acceleration_state
    from brisk.diagnose.report import one_line

    cfg, plan = make_plan(tiny_config(tmp_path, **{"speed.preset": "fast", **FROZEN}), "cpu", 1)
    state = acceleration_state(cfg, torch.device("cpu"), plan)
    assert state["preset"] == "fast" and state["switches_on"] == list(plan.on) and state["plan_notes"]
    line = one_line(state)
    assert "preset=fast switches=" in line and "packing" in line and "cuda_graph" not in line


def test_a_bench_arm_takes_a_preset_over_the_base_config(tmp_path):
    from brisk.bench.bench import with_overrides

    base = tiny_config(tmp_path, **FROZEN)
    arm = with_overrides(base, ["speed.preset=fast", "speed.label_head=false"])
    assert arm.speed.cuda_graph and arm.speed.compile and not arm.speed.label_head
    with pytest.raises(ConfigError, match="needs speed.packing"):
        with_overrides(base, ["speed.cuda_graph=true"])


def test_the_command_line_reaches_every_bench_arm_over_its_preset(tmp_path):
    """An arm's preset writes out its own pack_buckets over the base config's; the command line's (round 12 meant
    to cut the buckets this way, and both arms ran with the preset's 15) stay, unless the arm sets its own."""
    import dataclasses

    from brisk.bench.bench import arm_configs
    from brisk.config import BenchArm

    base = tiny_config(tmp_path, **FROZEN, **{"speed.pack_buckets": [256, 512]})
    arms = [BenchArm(name="preset", overrides=["speed.preset=fast"]), BenchArm(name="plain", overrides=[]),
            BenchArm(name="own", overrides=["speed.preset=fast", "speed.pack_buckets=[1024]"])]
    cfg = dataclasses.replace(base, bench=dataclasses.replace(base.bench, arms=arms))
    assert arm_configs(cfg)[0].speed.pack_buckets != [256, 512]  # the preset's own
    preset, plain, own = arm_configs(cfg, ["speed.pack_buckets=[256,512]", "train.max_steps=3"])
    assert preset.speed.pack_buckets == plain.speed.pack_buckets == [256, 512]
    assert own.speed.pack_buckets == [1024]  # an arm's own key wins over the command line
    assert preset.speed.cuda_graph and not plain.speed.cuda_graph


def test_chat_switches_and_rules(tmp_path):
    from .conftest import REPO
    from brisk.config import load_config

    demo = REPO / "configs" / "sft_demo.yaml"
    with pytest.raises(ConfigError, match="model.family=causal_lm: speed.frozen_eval"):
        load_config(demo, [f"train.output_dir={tmp_path}", "speed.frozen_eval=true"])
    with pytest.raises(ConfigError, match=r"does not take speed.liger_loss \(model.family=causal_lm's\)"):
        tiny_config(tmp_path, **{"speed.liger_loss": True})
    with pytest.raises(ConfigError, match="a causal LM has no encoder"):
        load_config(demo, [f"train.output_dir={tmp_path}", "model.encoder.activation_checkpoint=1"])
    with pytest.raises(ConfigError, match="two ways to compute the loss"):
        load_config(demo, [f"train.output_dir={tmp_path}", "speed.label_head=true", "speed.liger_loss=true"])
    cfg = load_config(demo, [f"train.output_dir={tmp_path}", "speed.fla_kernels=true"])
    with pytest.raises(ConfigError, match="need a CUDA device"):
        make_plan(cfg, "cpu", 1)
    cfg, plan = make_plan(load_config(demo, [f"train.output_dir={tmp_path}", "speed.preset=fast"]), "cpu", 1)
    assert set(plan.on) == {"packing", "label_head", "linear_attention_batched"}
    assert "left off fla_kernels" in plan.notes[0] and "frozen-audio" not in " ".join(plan.notes)


def test_a_preset_leaves_off_what_this_machine_cannot_run(tmp_path, monkeypatch):
    import sys
    import types

    from .conftest import REPO
    from brisk.config import load_config

    monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))  # installed, but refused on this GPU

    cfg = load_config(REPO / "configs" / "sft_demo.yaml", [f"train.output_dir={tmp_path}", "speed.preset=fast"])
    cfg, plan = make_plan(cfg, "cuda", 1, unusable={"fla_kernels": "fla refuses Triton 3.6 on Hopper"})
    assert "fla_kernels" not in plan.on
    assert {"packing", "label_head", "fused_adamw", "linear_attention_batched"} <= set(plan.on)
    assert "left off fla_kernels (fla refuses Triton 3.6 on Hopper)" in plan.notes[0]
    # fla's fused gated norm is another kernel than the refused backward: it stays on
    assert "fla_gated_norm" in plan.on


def test_fla_on_an_fp32_hybrid_is_refused_whoever_would_call_it(tmp_path, monkeypatch):
    """Round 9 (one H200): fla's gate gradient with fp32 inputs 4.0e-2 relative off the fp64 recurrence, against
    3.5e-3 in bf16, and a fp32 model's dt_bias gradient 3.2 relative off transformers' torch path. With fla
    installed, transformers binds it for every Gated DeltaNet layer, speed.fla_kernels or not."""
    import sys
    import types

    from .conftest import REPO
    from brisk.config import load_config

    demo, out = REPO / "configs" / "sft_demo.yaml", f"train.output_dir={tmp_path}"
    hybrid = ("model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 64, intermediate_size: 128, "
              "num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 32, "
              "linear_num_key_heads: 1, linear_num_value_heads: 2, linear_key_head_dim: 128, linear_value_head_dim: 32, "
              "layer_types: [linear_attention, full_attention]}")

    def plan(*over):
        return make_plan(load_config(demo, [out, hybrid, *over]), "cuda", 1)[1]

    assert "fla_kernels" not in plan("model.llm.dtype=fp32").on  # fla not installed: transformers' torch path
    with pytest.raises(ConfigError, match=r"model.llm.dtype=fp32 with flash-linear-attention .* set model.llm.dtype=bf16"):
        plan("model.llm.dtype=fp32", "speed.fla_kernels=true")
    monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))  # installed: transformers would call it
    for over in (["speed.fla_kernels=false"], ["speed.preset=fast"]):
        with pytest.raises(ConfigError, match="or uninstall fla-core"):
            plan("model.llm.dtype=fp32", *over)
    assert "fla_kernels" in plan("model.llm.dtype=bf16", "speed.preset=fast").on
    # a model without Gated DeltaNet layers (the demo's Qwen3) is not concerned
    make_plan(load_config(demo, [out, "model.llm.dtype=fp32", "speed.preset=fast"]), "cuda", 1)
