"""A model family added from outside brisk/ (tests/toy_family.py, loaded with `--family-module`): it trains,
validates, exports in its own format and evaluates through the same commands, and its one-line errors work."""

from __future__ import annotations

import json

import sys

import pytest

from brisk.cli import main

from .conftest import REPO


@pytest.fixture(autouse=True)
def _toy_family_leaves():
    """The toy family is this file's alone: the other tests see brisk's own families."""
    yield
    from brisk.families import registry

    registry._REGISTRY.pop("toy_lm", None)
    sys.modules.pop("tests.toy_family", None)


def test_a_family_from_outside_trains_evaluates_and_exports(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["--family-module", "tests.toy_family", "train", str(REPO / "configs" / "sft_demo.yaml"),
            "model.family=toy_lm", "model.llm.config.num_hidden_layers=1", "train.max_steps=4", "train.export=toy",
            f"train.output_dir={run}", "train.progress=false", "train.tensorboard=false", "diagnose.report=false"]
    assert main(argv + ["toy_lm.manifest=manifest.json"]) == 0
    manifest = json.loads((run / "model-toy" / "manifest.json").read_text())  # its own config key, read by its exporter
    assert manifest["family"] == "toy_lm" and manifest["tensors"] and (run / "model-toy" / "weights.safetensors").is_file()
    saved = (run / "config.yaml").read_text()
    assert "family: toy_lm" in saved and "toy_lm:\n" in saved and "  manifest: manifest.json\n" in saved
    capsys.readouterr()
    assert main(["--family-module", "tests.toy_family", "eval", str(run), str(REPO / "data" / "chat_demo" / "valid.jsonl"),
                 "--max-new-tokens", "4", "--max-utts", "4"]) == 0
    assert "exact match" in capsys.readouterr().out
    # its formats are its own: hf is another family's
    assert main(argv[:-4] + ["train.export=hf", f"train.output_dir={tmp_path / 'x'}"]) == 2
    assert "train.export" in capsys.readouterr().err


def test_an_unknown_family_module_is_one_line(capsys):
    assert main(["--family-module", "tests.no_such_family", "train"]) == 2
    assert capsys.readouterr().err.startswith("error: --family-module tests.no_such_family: cannot import it")


def test_a_family_section_is_checked_shown_and_its_own(capsys):
    import tests.toy_family  # noqa: F401 - registers toy_lm
    from brisk.config import ConfigError, load_config
    from brisk.config.help import help_text

    sft = REPO / "configs" / "sft_demo.yaml"
    assert load_config(sft, ["model.family=toy_lm", "train.export=toy"]).sections["toy_lm"].manifest == "toy.json"  # its default
    with pytest.raises(ConfigError, match="unknown config key toy_lm.manifesto.*did you mean toy_lm.manifest"):
        load_config(sft, ["model.family=toy_lm", "train.export=toy", "toy_lm.manifesto=x.json"])
    with pytest.raises(ConfigError, match="toy_lm: the config section of model.family=toy_lm, but model.family is "
                                          "causal_lm"):
        load_config(sft, ["toy_lm.manifest=x.json"])
    text = help_text()
    assert "[toy_lm]  model.family=toy_lm only" in text
    assert any(line.split()[:1] == ["toy_lm.manifest"] and "file name of the export's manifest" in line
               for line in text.splitlines())
