"""Every brisk command in README.md and docs/*.md, as written, from an empty folder (issue 32): each parses, names
configs and data that resolve without the checkout, and the cheap ones run: the speech loop's report, eval,
export (right after training, which already exported) and transcribe on a run of the documented name, and the
chat demo's train + eval."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from brisk.cli import build_parser, main

from .conftest import DEMO, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `brisk`) for every brisk command in a code block; usage lines' [optional] parts and
    comments dropped, continuation lines joined."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                for part in line.split("&&"):
                    part = re.sub(r"\s#.*$", "", part).strip()
                    m = re.match(r"^(?:brisk|python -m brisk|torchrun .*?-m brisk)\s+(.*)$", part)
                    if not m:
                        continue
                    argv = shlex.split(re.sub(r"\[[^\]]*\]", "", m.group(1)))
                    out.append((f"{doc.name}: {part}", argv))
    return out


COMMANDS = documented_commands()


def test_the_docs_have_commands():
    verbs = {argv[0] for _, argv in COMMANDS}
    assert {"train", "eval", "export", "transcribe", "report", "probe", "bench", "doctor"} <= verbs


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_documented_command_parses_and_names_what_ships(where, argv, tmp_path, monkeypatch):
    from brisk.cli import _config_and_overrides
    from brisk.config import _known_path, data_path, load_config, parse_override

    monkeypatch.chdir(tmp_path)  # an empty folder: no configs/, no data/
    args = build_parser().parse_args(argv)
    if argv[0] in ("train", "bench", "profile") and not args.__dict__.get("help_config"):
        items = [i for i in args.items if i != "..."]
        path, overrides = _config_and_overrides(items, ROOT / "configs" / "demo.yaml")
        if path is not None and path.name not in ("CONFIG",):
            assert path.is_file(), where  # a shipped config, by name or as configs/NAME.yaml
            load_config(path, check_paths=True)  # it loads, and its own data files exist
        for o in overrides:
            if o.endswith("=..."):  # a placeholder value: the key must still be one
                assert _known_path(o.split("=", 1)[0]), where
                continue
            key, value = parse_override(o)  # every key is a config key
            if isinstance(value, str) and value.startswith("data/"):
                assert Path(data_path(value)).exists(), where
    for a in argv[1:]:
        if a.startswith("data/"):
            assert Path(data_path(a)).exists(), where  # shipped data, named as the docs write it


@pytest.mark.slow
def test_the_documented_loop_runs_as_written(tmp_path, monkeypatch, capsys):
    """README steps 4-7 on a run of the documented name (runs/nano, a tiny stand-in trained here), and
    docs/sft.md's chat demo, each command exactly as the docs give it."""
    from brisk.config import load_config
    from brisk.train.run import train

    monkeypatch.chdir(tmp_path)
    train(load_config(ROOT / "configs" / "demo.yaml", tiny_overrides(tmp_path / "runs" / "nano", **{
        "train.max_steps": 2, "train.export": "funasr", "train.val_decode": 0})))
    # the data the docs' placeholders stand for: test.jsonl (a few demo lines), a.wav, b.flac, wav.scp and text
    lines = (DEMO / "valid.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    Path("test.jsonl").write_text("\n".join(x.replace("!audio/", f"!{DEMO}/audio/") for x in lines) + "\n")
    wave, fs = sf.read(str(DEMO / "audio" / "valid" / "utt0001.flac"))
    sf.write("a.wav", np.asarray(wave), fs)
    sf.write("b.flac", np.asarray(wave), fs)
    Path("wav.scp").write_text("u1 a.wav\nu2 b.flac\n")
    Path("text").write_text("u1 blue five one green\nu2 blue five one green\n")
    wanted = {"data speech wav.scp text --out train.jsonl", "report runs/nano", "eval runs/nano test.jsonl",
              "export runs/nano --format hf", "transcribe runs/nano a.wav b.flac", "doctor"}
    ran = set()
    for where, argv in COMMANDS:
        text = " ".join(argv)
        if text in wanted and text not in ran:
            capsys.readouterr()
            assert main(argv + (["--max-new-tokens", "4"] if argv[0] in ("eval", "transcribe") else [])) == 0, where
            ran.add(text)
    assert ran == wanted
    # docs/sft.md: the chat demo (shortened: its full length is measured in bench/LOG.md), then its eval
    chat = [argv for _, argv in COMMANDS if argv[:2] == ["train", "configs/sft_demo.yaml"]][0]
    assert main(chat + ["train.max_steps=10", "diagnose.report=false"]) == 0
    chat_eval = [argv for _, argv in COMMANDS if argv[:2] == ["eval", "runs/sft_demo"]][0]
    assert main(chat_eval + ["--max-new-tokens", "8"]) == 0
    assert "exact match" in capsys.readouterr().out
