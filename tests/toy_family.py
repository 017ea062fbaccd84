"""A fourth model family from outside brisk/: a text-only causal LM with an export format of its own, registered by
this module alone (`brisk --family-module tests.toy_family ...`, or a package's `brisk.families` entry point).
brisk's own code is not edited for it: its parts are brisk's public builders and readers, and its exporter is here."""

from __future__ import annotations

import json
from pathlib import Path

from brisk.families import Family, Ref, register

FORMAT = "toy"


def write_toy(model, cfg, state: dict, out: Path, dtype: str, tokenizer) -> None:
    """The family's own export: its weights as safetensors and a manifest naming the family and the tensors."""
    from safetensors.torch import save_file

    from brisk.models.lm import DTYPES

    weights = {k: v.detach().to(DTYPES[dtype]).clone() for k, v in state.items()}  # tied weights: a copy each
    save_file(weights, str(out / "weights.safetensors"))
    (out / "toy.json").write_text(json.dumps({"family": FAMILY.name, "tensors": sorted(weights)}), encoding="utf-8")


def write_readme(out: Path, fmt: str, dtype: str, cfg) -> None:
    (out / "README.md").write_text(f"# A toy_lm export ({fmt}, {dtype})\n", encoding="utf-8")


FAMILY = register(Family(
    name="toy_lm",
    summary="a text-only causal LM registered from outside brisk (tests/toy_family.py)",
    switches=frozenset({"packing", "fused_adamw", "label_head"}),
    presets={"fast": {"packing": True, "label_head": True}},
    labelled="assistant",
    build=Ref("brisk.models.build:build_chat_model"),
    dataset=Ref("brisk.data.loader:chat_dataset"),
    prepare=Ref("brisk.data.loader:chat_prepare"),
    exporters={FORMAT: Ref("tests.toy_family:write_toy")},
    readme=Ref("tests.toy_family:write_readme"),
    eval_main=Ref("brisk.eval.chat_eval:chat_eval_main"),
))
