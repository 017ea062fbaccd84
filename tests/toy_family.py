"""A fourth model family from outside brisk/: a text-only causal LM with a config key and an export format of its
own, registered by this module alone (`brisk --family-module tests.toy_family ...`, or a package's `brisk.families` entry point).
brisk's own code is not edited for it: it borrows the causal_lm family's model, data and eval parts (and, for
them, that family's config keys), and its exporter is here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from brisk.families import Family, register, section
from brisk.keys import key
from brisk.families import causal_lm

FORMAT = "toy"


@dataclass
class ToyConfig(causal_lm.CausalLMConfig):
    """The toy family's own keys: toy_lm.manifest in YAML or on the command line, and the causal_lm keys its
    borrowed data part reads (toy_lm.max_len, ...)."""

    manifest: str = key("toy.json", "file name of the export's manifest", resume="free")  # no number changes


def write_toy(model, cfg, state: dict, out: Path, dtype: str, tokenizer) -> None:
    """The family's own export: its weights as safetensors and a manifest naming the family and the tensors."""
    from safetensors.torch import save_file

    from brisk.models.lm import DTYPES

    weights = {k: v.detach().to(DTYPES[dtype]).clone() for k, v in state.items()}  # tied weights: a copy each
    save_file(weights, str(out / "weights.safetensors"))
    (out / section(cfg).manifest).write_text(json.dumps({"family": FAMILY.name, "tensors": sorted(weights)}), encoding="utf-8")


def write_readme(out: Path, fmt: str, dtype: str, cfg) -> None:
    (out / "README.md").write_text(f"# A toy_lm export ({fmt}, {dtype})\n", encoding="utf-8")


FAMILY = register(Family(
    name="toy_lm",
    summary="a text-only causal LM registered from outside brisk (tests/toy_family.py)",
    switches=frozenset({"packing", "fused_adamw", "label_head"}),
    presets={"fast": {"packing": True, "label_head": True}},
    labelled="assistant",
    build=causal_lm.build,
    dataset=causal_lm.dataset,
    prepare=causal_lm.prepare,
    exporters={FORMAT: write_toy},
    readme=write_readme,
    eval_main=causal_lm.eval_main,
    config=ToyConfig,
))
