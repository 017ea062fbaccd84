"""The config tree: YAML + overrides, clear errors naming the key, includes, real sizes."""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError, load_config

from .conftest import DEMO_CONFIG, REPO


def test_demo_config_loads_and_resolves_paths_against_the_file():
    cfg = load_config(DEMO_CONFIG)
    assert cfg.data.train == str((REPO / "data/demo/train_more.jsonl").resolve())  # data/ links to brisk/bundled
    assert cfg.speed.compile is False and cfg.speed.sdpa_backends is None  # eager defaults


def test_unknown_yaml_key_is_named(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  max_stepz: 3\n")
    with pytest.raises(ConfigError, match="unknown config key train.max_stepz"):
        load_config(f)


def test_unknown_yaml_key_names_its_file_and_the_key_meant(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("include: demo\ntrain:\n  max_epoch: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown config key train.max_epoch \(did you mean train.max_epochs\?\)"):
        load_config(f)


def test_include_takes_a_shipped_configs_name(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("include: demo\ntrain:\n  max_steps: 7\n")
    cfg, demo = load_config(f), load_config(DEMO_CONFIG)
    assert cfg.train.max_steps == 7 and cfg.data.train == demo.data.train and cfg.model == demo.model
    f.write_text("include: demoo\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: include: demoo: no file .*nor a shipped config of that name"):
        load_config(f)


def test_unknown_override_is_named():
    with pytest.raises(ConfigError, match="unknown config key speed.compiel"):
        load_config(DEMO_CONFIG, ["speed.compiel=true"])


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="train.max_steps: expected an integer"):
        load_config(DEMO_CONFIG, ["train.max_steps=lots"])
    with pytest.raises(ConfigError, match="speed.compile: expected true or false"):
        load_config(DEMO_CONFIG, ["speed.compile=maybe"])
    with pytest.raises(ConfigError, match="speed.graph_capture='later': use ahead or seen"):
        load_config(DEMO_CONFIG, ["speed.graph_capture=later"])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="data.train: .*nope.jsonl does not exist"):
        load_config(DEMO_CONFIG, [f"data.train={tmp_path / 'nope.jsonl'}"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_bad_values_say_how_to_fix():
    with pytest.raises(ConfigError, match="speed.sdpa_backends"):
        load_config(DEMO_CONFIG, ["speed.sdpa_backends=[flesh]"])
    with pytest.raises(ConfigError, match="cuda_graph needs speed.packing"):
        load_config(DEMO_CONFIG, ["speed.cuda_graph=true"])


def test_include_and_override_order_and_exponent_floats(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("optim: {lr: 0.5, warmup_steps: 7}\ntrain: {max_steps: 3}\n")
    top = tmp_path / "top.yaml"
    top.write_text("include: base.yaml\noptim: {lr: 1e-3}\n")
    cfg = load_config(top, ["train.max_steps=9"], check_paths=False)
    assert cfg.optim.lr == 1e-3 and cfg.optim.warmup_steps == 7 and cfg.train.max_steps == 9


def test_fun_asr_nano_config_has_the_real_sizes():
    from brisk.models.build import build_llm
    from brisk.models.lm import param_count
    from brisk.families import section
    from brisk.families.fun_asr_nano.model import SpeechLLM

    cfg = load_config(REPO / "configs/fun_asr_nano.yaml")
    with torch.device("meta"):
        m = SpeechLLM(cfg.model, section(cfg), build_llm(cfg.model))
    assert param_count(m.audio_encoder) == 221_136_992
    assert param_count(m.audio_adaptor) == 12_604_928
    assert param_count(m.llm) == 596_049_920
    assert param_count(m, trainable=True) == 596_049_920  # encoder and adaptor frozen, LLM trained
    assert (cfg.data.batch_tokens, cfg.data.max_utts, cfg.data.sort_size) == (6000, 10, 1024)
    assert (cfg.optim.lr, cfg.optim.grad_clip, cfg.model.llm.dtype) == (2e-4, 5.0, "bf16")


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs").glob("*.yaml")))
def test_every_shipped_config_and_bench_arm_loads(name):
    """A shipped config with a typo or a rule-breaking bench arm fails here, not on the GPU machine."""
    from brisk.bench.bench import with_overrides

    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    for arm in cfg.bench.arms:
        with_overrides(cfg, arm.overrides)


def test_load_config_takes_a_shipped_configs_name(tmp_path, monkeypatch):
    """As `brisk train demo` does: a bare name with no such file here is the shipped config (it was refused with
    "did you mean demo?")."""
    monkeypatch.chdir(tmp_path)
    assert load_config("demo").model.family == "fun_asr_nano"
    assert load_config("sft_demo.yaml").model.family == "causal_lm"
    with pytest.raises(ConfigError, match=r"nor a shipped config of that name .*did you mean demo\?"):
        load_config("demoo")


def test_a_shipped_config_path_from_another_folder_names_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # README examples say configs/sft_demo.yaml: that path exists in the checkout only
    with pytest.raises(ConfigError, match=r"configs/sft_demo.yaml does not exist here; .*brisk train sft_demo"):
        load_config("configs/sft_demo.yaml")
    with pytest.raises(ConfigError, match=r"nope/other.yaml does not exist$"):
        load_config("nope/other.yaml")


def test_override_inside_a_nested_llm_sub_config_keeps_its_siblings():
    """model.llm.config's sub-configs (Qwen3-ASR's audio_config, text_config) take one key from the command line;
    the other keys of that sub-config stay (they were all dropped: the audio tower fell back to transformers'
    default sizes)."""
    cfg = load_config(REPO / "configs" / "qwen3_asr_demo.yaml", ["model.llm.config.audio_config.n_window_infer=100",
                                                        "model.llm.config.text_config.num_hidden_layers=3"])
    audio, text = cfg.model.llm.config["audio_config"], cfg.model.llm.config["text_config"]
    assert audio["n_window_infer"] == 100 and audio["d_model"] == 96 and audio["output_dim"] == 128
    assert text["num_hidden_layers"] == 3 and text["hidden_size"] == 128


def test_a_model_folder_that_is_not_there_is_named_as_missing(tmp_path):
    """model.path naming no folder says so (a mistyped path), not that a folder lacks its config.yaml."""
    import pytest

    from brisk.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="no such folder"):
        load_config("configs/fun_asr_nano.yaml", [f"model.path={tmp_path / 'Fun-ASR-Nano-2512'}"])
    with pytest.raises(ConfigError, match="no config.yaml there"):
        load_config("configs/fun_asr_nano.yaml", [f"model.path={tmp_path}"])
