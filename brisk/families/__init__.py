"""Model families: one registered object a family, asked by the general rooms and never named by them.

After torchtitan's TrainSpec registry: ``model.family`` picks a ``Family``, and everything that differs between
Fun-ASR-Nano, a plain causal LM and Qwen3-ASR is read from it:

- what the plan needs before any model exists (floor 1, no torch): the speed switches the family takes, its
  preset values, the switches that need its audio path frozen, its config rules, what its labels are;
- its parts on higher floors, named as ``Ref("module:attribute")`` and imported when first called: ``build``
  (ModelConfig, device) -> the plain model, ``dataset`` (a split's samples), ``exporters`` (train.export
  formats -> folder writers) and ``readme``, ``recognizer`` (decoding for eval and train.val_decode) or
  ``eval_main`` (a `brisk eval` of its own);
- structure hooks, plain functions of a built model that speed/, memory/ and distributed/ call instead of
  reaching into it: ``decoder_layers(model)``, ``encoder_blocks(model, compile=False)``, ``audio_path``
  (the names of the audio modules the frozen path copies);
- the transformers folders it loads (``folder_types``, config.json's model_type) and how (``folder_overrides``):
  ``folder_family(folder)`` says whose a folder is, for `brisk eval FOLDER` and `brisk transcribe FOLDER`.

Each family is one module here that registers its object; ``get(name)`` returns it, and an unknown name is one
ConfigError line listing the families. The old top-level ``task:`` word (speech, chat) is an alias.
"""

from __future__ import annotations

from .registry import (DEFAULT, Family, FamilyRule, Ref, all_families, family_of, folder_family, get,  # noqa: F401
                       load_module, load_plugins, names, register)
from .contract import FamilyModel, SpeechModel  # noqa: F401
from . import causal_lm, fun_asr_nano, qwen3_asr  # noqa: E402,F401 - each registers its family
