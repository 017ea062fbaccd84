"""brisk/families: model.family picks a registered family; the old top-level task: word is one line naming
model.family (a run folder saved with both still loads); a bad name, a clash or a preset a family lacks is one
ConfigError line, never a KeyError."""

from __future__ import annotations

import dataclasses
import logging
import sys

import pytest
import yaml

from brisk import families
from brisk.config import ConfigError, load_config
from brisk.plan import presets, preset_values

from .conftest import REPO


def test_the_old_task_word_is_one_line_naming_model_family(tmp_path):
    old = tmp_path / "old.yaml"  # a config written before model.family: the shipped demo with the old word
    old.write_text(f"include: {REPO / 'configs' / 'demo.yaml'}\ntask: chat\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"old.yaml: task: chat is no longer read; write model.family: causal_lm"):
        load_config(old, [f"train.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"override 'task=speech'.*write model.family: fun_asr_nano") as e:
        load_config(REPO / "configs" / "qwen3_asr_demo.yaml", [f"train.output_dir={tmp_path}", "task=speech"])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"task: vision is no longer read; write model.family \(one of causal_lm"):
        load_config(REPO / "configs" / "demo.yaml", ["task=vision"])
    with pytest.raises(ConfigError, match="model.family='speech': use one of the model families"):
        families.get("speech")


def test_a_run_folder_saved_with_task_beside_model_family_still_loads(tmp_path):
    """An older brisk saved ``task:`` (filled from model.family) in every run's config.yaml: resuming or evaluating
    such a run reads it as it was."""
    cfg = load_config(REPO / "configs" / "sft_demo.yaml", [f"train.output_dir={tmp_path}"])
    saved = cfg.to_dict()
    assert "task" not in saved
    saved["task"] = "chat"
    old = tmp_path / "config.yaml"
    old.write_text(yaml.safe_dump(saved), encoding="utf-8")
    assert load_config(old).model.family == "causal_lm"
    saved["model"]["family"] = "qwen3_asr"  # the two disagree: refused, not guessed
    old.write_text(yaml.safe_dump(saved), encoding="utf-8")
    with pytest.raises(ConfigError, match="task: chat is no longer read"):
        load_config(old)


def test_presets_are_the_families_own_and_a_missing_one_is_a_config_error(monkeypatch):
    assert presets()["fast"]["fun_asr_nano"] is families.get("fun_asr_nano").presets["fast"]
    assert set(presets()["fast"]) == set(families.names())
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
    model = family_of(cfg).build(cfg, None)
    assert isinstance(model, FamilyModel) and isinstance(model, SpeechModel) == speech


def test_a_key_that_moved_into_a_family_section_still_reads(tmp_path, caplog):
    """data.language became qwen3_asr.language: an older config's value is read as it (one log line), an older run
    folder's unset one (of any family) is dropped, and the old key on the command line is one line naming the new."""
    old = tmp_path / "old.yaml"
    written = load_config(REPO / "configs" / "qwen3_asr_demo.yaml", [f"train.output_dir={tmp_path}"]).to_dict()
    del written["qwen3_asr"]
    written["data"]["language"] = "German"  # as an older brisk wrote it
    old.write_text(yaml.safe_dump(written), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="brisk"):
        cfg = load_config(old, [f"train.output_dir={tmp_path}"])
    assert families.section(cfg).language == "German"
    assert any("data.language is now qwen3_asr.language" in r.message for r in caplog.records)
    saved = load_config(REPO / "configs" / "demo.yaml", [f"train.output_dir={tmp_path}"]).to_dict()
    saved["data"]["language"] = None  # as every run folder of an older brisk holds it
    old.write_text(yaml.safe_dump(saved), encoding="utf-8")
    assert load_config(old).model.family == "fun_asr_nano"
    with pytest.raises(ConfigError, match=r"override 'data.language=English': data.language is now "
                                          r"qwen3_asr.language; give qwen3_asr.language=English"):
        load_config(REPO / "configs" / "qwen3_asr_demo.yaml", ["data.language=English"])


def test_the_chat_keys_moved_into_the_causal_lm_section_read_from_older_configs_and_exports(tmp_path):
    """data.max_len / overlong / chat_template became causal_lm.*: an older chat config's values (a relative
    template path resolved against its folder, as before) are read as them; a speech run folder's unset ones are
    dropped; an older export's brisk.json names them under the new keys (its template resolved in the folder)."""
    import json

    from brisk.formats.brisk_keys import read_keys_file

    (tmp_path / "t.jinja").write_text("{% generation %}{% endgeneration %}", encoding="utf-8")
    written = load_config(REPO / "configs" / "sft_demo.yaml", [f"train.output_dir={tmp_path}"]).to_dict()
    del written["causal_lm"]
    written["data"].update(max_len=300, overlong="skip", chat_template="t.jinja")  # as an older brisk wrote it
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(written), encoding="utf-8")
    own = families.section(load_config(tmp_path / "old.yaml"))
    assert (own.max_len, own.overlong, own.chat_template) == (300, "skip", str(tmp_path / "t.jinja"))
    speech = load_config(REPO / "configs" / "demo.yaml", [f"train.output_dir={tmp_path}"]).to_dict()
    speech["data"].update(max_len=2048, overlong="truncate", chat_template=None)
    (tmp_path / "speech.yaml").write_text(yaml.safe_dump(speech), encoding="utf-8")
    assert "causal_lm" not in load_config(tmp_path / "speech.yaml").to_dict()
    # an older file that includes a newer base (one with a causal_lm section): the file's own values still win
    (tmp_path / "inc.yaml").write_text("include: sft_qwen3_1p7b\ndata: {max_len: 1024, overlong: skip}\n", encoding="utf-8")
    inc = families.section(load_config(tmp_path / "inc.yaml", check_paths=False))
    assert (inc.max_len, inc.overlong) == (1024, "skip")
    assert families.section(load_config("sft_qwen3_1p7b", check_paths=False)).max_len == 4096
    # a family from outside that extends the section to borrow causal_lm's parts gets its old values too
    import tests.toy_family  # noqa: F401 - registers toy_lm

    written["model"]["family"], written["train"]["export"] = "toy_lm", "toy"
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(written), encoding="utf-8")
    try:
        toy = families.section(load_config(tmp_path / "toy.yaml"))
        assert (toy.max_len, toy.overlong) == (300, "skip")
    finally:  # the toy family is this test's alone
        families.registry._REGISTRY.pop("toy_lm", None)
        sys.modules.pop("tests.toy_family", None)
    for family, expect in (("causal_lm", {"causal_lm.max_len": 96, "causal_lm.chat_template": str(tmp_path / "x.jinja")}),
                           ("fun_asr_nano", {})):
        (tmp_path / "brisk.json").write_text(json.dumps({"family": family, "keys": {
            "model.llm.dtype": "bf16", "data.max_len": 96, "data.chat_template": "x.jinja"}}), encoding="utf-8")
        assert read_keys_file(tmp_path)["keys"] == {"model.llm.dtype": "bf16", **expect}


def test_key_roles_are_read_from_the_declarations_the_families_sections_included():
    """brisk.config.roles: the path keys and the exported keys come from key(path=, inference=, exported=), a
    family's own section under its name; the resume rule's run-only sections are the tree's other sections."""
    from brisk.config import Config
    from brisk.config.roles import exported_keys, path_keys
    from brisk.config.roles import resume_roles
    from brisk.formats.run_config import RUN_SECTIONS
    from brisk.formats.run_config import refused as refused_with

    def refused(key):
        return refused_with(key, resume_roles())

    assert {"data.train", "model.llm.path", "causal_lm.chat_template", "data.chat_template"} <= path_keys("in")
    assert {"train.output_dir", "speed.inductor_cache_dir"} <= path_keys("out") and not path_keys("out") & path_keys("in")
    exported = exported_keys()
    assert exported["causal_lm.chat_template"] == "chat_template_training.jinja"
    assert exported["fun_asr_nano.frontend.cmvn_file"] == "am.mvn" and exported["causal_lm.max_len"] is None
    assert "data.batch_tokens" not in exported and "qwen3_asr.language" not in exported
    shared = {f.name for f in dataclasses.fields(Config)} - {"sections"}
    assert set(RUN_SECTIONS) | {"model", "data"} == shared
    assert refused("causal_lm.max_len") and refused("qwen3_asr.language") and not refused("optim.lr")
    assert refused("data.max_len") and refused("data.chat_template")  # an older run folder's names of them
    assert refused("data.train") and refused("data.prompt_conf.use_hist") and not refused("data.batch_tokens")
    assert refused("model.llm.config.hidden_size") and not refused("model.seed") and not refused("model.init")
    assert refused_with("toy_lm.manifest", {}) and not refused_with("toy_lm.manifest", {"toy_lm.manifest": "free"})


def test_fun_asr_nano_sizes_moved_into_its_section_read_from_older_configs_runs_and_exports(tmp_path, caplog):
    """model.frontend / model.ctc and the sizes under model.encoder / model.adaptor became fun_asr_nano.*, while
    what trains (model.encoder.freeze, model.adaptor.freeze) stayed: an older config (a relative CMVN path resolved
    against its folder, as before) reads as the new keys with one log line; its own values win over a newer base it
    includes; an older run folder resumes without a change; an older export's brisk.json names its CMVN file under
    the new key; the old name on the command line is one line naming the new."""
    import json

    from brisk.config.migrate import read_moved
    from brisk.formats.brisk_keys import read_keys_file
    from brisk.formats.run_config import changes

    (tmp_path / "am.mvn").write_bytes((REPO / "data" / "demo" / "am.mvn").read_bytes())
    new = load_config(REPO / "configs" / "demo.yaml", [f"train.output_dir={tmp_path}"])
    written = new.to_dict()
    own = written.pop("fun_asr_nano")
    own["frontend"]["cmvn_file"] = "am.mvn"  # relative, as a hand-written file gives it
    written["model"]["frontend"], written["model"]["ctc"] = own["frontend"], own["ctc"]
    written["model"]["encoder"].update(own["encoder"])
    written["model"]["adaptor"].update(own["adaptor"])
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(written), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="brisk"):
        old = load_config(tmp_path / "old.yaml")
    assert families.section(old).frontend.cmvn_file == str(tmp_path / "am.mvn")
    assert families.section(old).encoder == families.section(new).encoder
    assert families.section(old).adaptor == families.section(new).adaptor
    assert old.model.encoder.freeze is False and old.model.adaptor.freeze is False  # the demo trains them
    lines = [r.message for r in caplog.records if "is now" in r.message or "are now" in r.message]
    assert len(lines) == 1 and "model.{frontend, ctc} are now under fun_asr_nano;" in lines[0]
    assert "model.encoder.{output_size, " in lines[0] and "are now under fun_asr_nano.encoder" in lines[0]
    # an older run folder's saved config: every key it holds, under the old names, is no change on a resume
    saved = json.loads(json.dumps(written))
    saved["model"]["frontend"]["cmvn_file"] = families.section(new).frontend.cmvn_file  # a run folder's: absolute
    assert changes(read_moved(saved, "run"), new.to_dict()) == {}
    # an older file that includes a newer base: the file's own value wins
    (tmp_path / "inc.yaml").write_text("include: demo\nmodel: {encoder: {num_blocks: 2}, frontend: {dither: 1.0}}\n",
                                       encoding="utf-8")
    inc = families.section(load_config(tmp_path / "inc.yaml", check_paths=False))
    assert (inc.encoder.num_blocks, inc.frontend.dither, inc.encoder.output_size) == (2, 1.0, 96)
    assert inc.frontend.cmvn_file.endswith("am.mvn")  # the base's other front-end keys stay
    # an older export's brisk.json: its CMVN file named under the old key, resolved in the folder
    (tmp_path / "brisk.json").write_text(json.dumps({"family": "fun_asr_nano", "keys": {
        "model.frontend.cmvn_file": "am.mvn", "model.adaptor.use_low_frame_rate": False}}), encoding="utf-8")
    assert read_keys_file(tmp_path)["keys"] == {"fun_asr_nano.frontend.cmvn_file": str(tmp_path / "am.mvn"),
                                                "fun_asr_nano.adaptor.use_low_frame_rate": False}
    with pytest.raises(ConfigError, match=r"override 'model.encoder.num_blocks=2': model.encoder.num_blocks is now "
                                          r"fun_asr_nano.encoder.num_blocks; give fun_asr_nano.encoder.num_blocks=2$"):
        load_config(REPO / "configs" / "demo.yaml", ["model.encoder.num_blocks=2"])
    with pytest.raises(ConfigError, match=r"model.frontend.dither is now fun_asr_nano.frontend.dither"):
        load_config(REPO / "configs" / "demo.yaml", ["model.frontend.dither=0"])
    with pytest.raises(ConfigError, match=r"model.frontend.dither is now fun_asr_nano.frontend.dither, a key of "
                                          r"model.family=fun_asr_nano; model.family=causal_lm has no such key: leave"):
        load_config("sft_demo", ["model.frontend.dither=0"], check_paths=False)
    # another family's config names no Fun-ASR-Nano key, and a section for another family is one line
    with pytest.raises(ConfigError, match=r"leave out the fun_asr_nano section .* or set model.family=fun_asr_nano"):
        load_config(REPO / "configs" / "demo.yaml", ["model.family=causal_lm"], check_paths=False)


def test_an_older_run_folder_resumes_and_is_checked_under_the_new_names(tmp_path, monkeypatch, caplog):
    """A resume of a run an older brisk saved (its checkpoint's config under the old names): no false "differs"
    warning; a checkpoint and config.yaml that really disagree on a moved key are still refused; --help-config
    describes the family's sub-sections."""
    import torch

    from brisk.config.help import help_text
    from brisk.config.roles import resume_roles
    from brisk.formats.run_config import check_run_files
    from brisk.train import run_state

    cfg = load_config(REPO / "configs" / "demo.yaml", [f"train.output_dir={tmp_path}"])
    old = cfg.to_dict()
    own = old.pop("fun_asr_nano")
    old["model"].update(frontend=own["frontend"], ctc=own["ctc"])
    old["model"]["encoder"].update(own["encoder"])
    old["model"]["adaptor"].update(own["adaptor"])
    monkeypatch.setattr(run_state, "checkpoint_config", lambda path: old)
    with caplog.at_level(logging.INFO, logger="brisk"):
        run_state.report(cfg, tmp_path, tmp_path / "ckpt-00000004.pt", 4)
    assert not [r for r in caplog.records if "differs" in r.message]
    old["model"]["encoder"]["num_blocks"] = 5  # the checkpoint's model is not config.yaml's
    torch.save({"config": old}, tmp_path / "ckpt-00000004.pt")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"fun_asr_nano.encoder.num_blocks: 5 -> 3"):
        check_run_files(tmp_path, tmp_path / "ckpt-00000004.pt", resume_roles())
    text = help_text()
    assert "[fun_asr_nano.frontend]  model.family=fun_asr_nano only: Kaldi fbank" in text
    # a FunASR folder given to another family is refused by that family's rule, before the folder is read
    (tmp_path / "funasr").mkdir()
    (tmp_path / "funasr" / "config.yaml").write_text("audio_encoder_conf: {output_size: 32}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model.path is a speech-LLM folder; with model.family=causal_lm"):
        load_config("sft_demo", [f"model.path={tmp_path / 'funasr'}"], check_paths=False)
