"""brisk/families: model.family picks a registered family; the old top-level task: word is an alias with one
line in the log; a bad name, a clash or a preset a family lacks is one ConfigError line, never a KeyError."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from brisk import families
from brisk.config import ConfigError, load_config
from brisk.plan import PRESETS, preset_values

from .conftest import REPO


def test_task_is_an_alias_of_model_family_with_one_note(tmp_path, caplog):
    old = tmp_path / "old.yaml"  # a config written before model.family: the shipped demo with the old word
    old.write_text(f"include: {REPO / 'configs' / 'demo.yaml'}\ntask: speech\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="brisk"):
        cfg = load_config(old, [f"train.output_dir={tmp_path}"])
    assert cfg.model.family == "fun_asr_nano" and cfg.task == "speech"
    notes = [r.message for r in caplog.records if "old name of model.family" in r.message]
    assert notes == ["config: task: speech is the old name of model.family (fun_asr_nano); it still works"]
    cfg = load_config(REPO / "configs" / "sft_demo.yaml", [f"train.output_dir={tmp_path}"])
    assert cfg.model.family == "causal_lm" and cfg.task == "chat"  # task is filled from the family
    assert families.get("speech").name == "fun_asr_nano" and families.get("chat").name == "causal_lm"


def test_a_task_and_a_family_that_disagree_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="task=chat and model.family=qwen3_asr name different model families") as e:
        load_config(REPO / "configs" / "qwen3_asr_demo.yaml", [f"train.output_dir={tmp_path}", "task=chat"])
    assert "\n" not in str(e.value)


def test_presets_are_the_families_own_and_a_missing_one_is_a_config_error(monkeypatch):
    assert PRESETS["fast"]["speech"] is families.get("fun_asr_nano").presets["fast"]
    assert PRESETS["fast"]["chat"] == PRESETS["fast"]["causal_lm"]
    bare = dataclasses.replace(families.get("qwen3_asr"), name="bare", presets={})
    monkeypatch.setitem(families.registry._REGISTRY, "bare", bare)
    with pytest.raises(ConfigError, match="speed.preset=fast: model.family=bare has no such preset"):
        preset_values("fast", True, family="bare")


def test_every_family_says_where_its_layers_are():
    for fam in families.all_families():
        assert fam.switches and "fast" in fam.presets and set(fam.presets["fast"]) - {
            "label_rows_frac", "pack_buckets", "compile_dynamic", "graph_capture"} <= fam.switches  # settings
        assert set(fam.frozen_audio) <= fam.switches and bool(fam.audio_path) == bool(fam.frozen_audio)


def test_a_transformers_folder_belongs_to_the_family_its_model_type_names(tmp_path):
    import json

    from brisk.formats.run_folder import folder_kind

    def folder(name: str, model_type: str | None) -> str:
        f = tmp_path / name
        f.mkdir()
        (f / "config.json").write_text(json.dumps({"model_type": model_type} if model_type else {}), encoding="utf-8")
        return f

    for model_type, family in (("qwen3_asr", "qwen3_asr"), ("fun_asr_nano", "fun_asr_nano"), ("qwen3", "causal_lm"),
                               (None, "causal_lm")):  # a causal LM's folder: whatever model_type it has
        f = folder(f"m-{model_type}", model_type)
        assert folder_kind(f) == "transformers" and families.folder_family(f).name == family, model_type
    assert families.folder_family(tmp_path) is None  # no config.json
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match="config.json: not a JSON object"):
        families.folder_family(bad)


def test_a_misspelt_family_gets_the_name_meant():
    with pytest.raises(ConfigError, match=r"model.family='qwen3asr': use one of .*; did you mean qwen3_asr\?"):
        families.get("qwen3asr")
    with pytest.raises(ConfigError) as e:
        families.get("whisper")
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("config, speech", [("demo.yaml", True), ("sft_demo.yaml", False), ("qwen3_asr_demo.yaml", True)])
def test_every_family_builds_a_model_of_the_written_contract(config, speech):
    """brisk.families.contract: what the general rooms may ask of a family's model, checked on each one built."""
    from brisk.config import load_config
    from brisk.families import FamilyModel, SpeechModel, family_of

    cfg = load_config(REPO / "configs" / config)
    model = family_of(cfg).build(cfg.model, None)
    assert isinstance(model, FamilyModel) and isinstance(model, SpeechModel) == speech
