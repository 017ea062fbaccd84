"""Config settings (key=value) after a command's options reach the config as settings before them do: `brisk
profile demo --steps 5 train.output_dir=runs/p` (argparse alone would stop at 'unrecognized arguments')."""

from __future__ import annotations

from brisk import cli


def test_settings_after_an_option_join_the_configs_settings(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "cmd_profile", lambda args: seen.append((args.items, args.steps)) or 0)
    assert cli.main(["profile", "demo", "--steps", "5", "train.output_dir=runs/p", "train.max_steps=3"]) == 0
    assert seen == [(["demo", "train.output_dir=runs/p", "train.max_steps=3"], 5)]

