"""Model families: one registered object a family, asked by the general rooms and never named by them.
After torchtitan's models/<name>/ folders and TrainSpec registry: each family is a package here
(brisk/families/<name>/) holding its model, data, decoding and export, and its ``__init__`` registers one
``Family`` spec. ``model.family`` picks it, and everything that differs between Fun-ASR-Nano, a plain causal LM and
Qwen3-ASR is read from it:
- what the plan needs before any model exists (floor 1, no torch): the speed switches the family takes, its
  preset values, the switches that need its audio path frozen, its config rules, what its labels are;
- its parts, functions that import the family's own modules when first called: ``build`` (ModelConfig, device)
  -> the plain model (a contract.FamilyModel), ``dataset`` (a split's samples), ``exporters`` (train.export
  formats -> folder writers) and ``readme``, ``recognizer`` (decoding for eval and train.val_decode) or
  ``eval_main`` (a `brisk eval` of its own);
- structure hooks, plain functions of a built model that speed/, memory/ and distributed/ call instead of
  reaching into it: ``decoder_layers(model)``, ``encoder_blocks(model, compile=False)``, ``audio_path``
  (the names of the audio modules the frozen path copies);
- the transformers folders it loads (``folder_types``, config.json's model_type) and how (``folder_overrides``):
  ``folder_family(folder)`` says whose a folder is, for `brisk eval FOLDER` and `brisk transcribe FOLDER`.
``get(name)`` returns a family; an unknown name is one ConfigError line listing the families. A family from
outside brisk registers itself the same way, from a module named by an installed package's ``brisk.families``
entry point or by ``brisk --family-module``.
"""

from __future__ import annotations

from importlib import import_module

from .registry import (DEFAULT, Family, FamilyRule, all_families, family_of, folder_family, get,  # noqa: F401
                       load_module, load_plugins, names, register, section)
from .contract import FamilyModel, SpeechModel  # noqa: F401

BUILT_IN = ("fun_asr_nano", "causal_lm", "qwen3_asr")  # each a package here whose __init__ registers its spec
for _name in BUILT_IN:
    import_module(f"{__name__}.{_name}")
