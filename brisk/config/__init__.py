"""One typed config tree for every brisk command.

A run is described by a YAML file plus ``key.sub=value`` overrides. Every key is checked against the dataclasses
of this package: an unknown key, a value of the wrong type or a missing file is a ``ConfigError`` that names the
key and says how to fix it. Relative paths in a YAML file are resolved against that file's folder, relative paths
given on the command line against the current directory. The resolved config is saved in the run folder and in
every checkpoint.

    roles.py     what each key is (path, exported), read from its declaration (brisk.keys.key) over every
                 section, the families' own included
    model.py     model.*: the family, the LLM and its LoRA, whether a speech family's encoder and adaptor train
    data.py      data.*: files, batching, checks, the batch sized to the GPU
    training.py  optim.* and train.*
    speed.py     speed.*, diagnose.*, probe.*, bench.*
    tree.py      Config, the whole tree (and the model family's own section)
    migrate.py   what older configs said: moved keys, the old task word
    build.py     a dict tree into a Config: types, unknown keys, overrides
    load.py      YAML files, model folders, paths, the shipped configs; saving and comparing configs
    llm.py       model.llm.config against transformers' config class
    help.py      brisk train --help-config
"""

from __future__ import annotations

from ..errors import ConfigError
from .build import _known_path, _set_dotted, build_config, did_you_mean, leaf_keys, optional_keys, parse_override
from .data import AutoBatchConfig, DataConfig
from .load import (BUNDLED, SHIPPED, _merge, check_files, config_changes, data_path, get_dotted, load_config,
                   read_yaml, save_config, shipped_config, shipped_data, shipped_names, yaml_error)
from .model import AudioAdaptorConfig, AudioEncoderConfig, LLMConfig, LoraConfig, ModelConfig
from .speed import BenchArm, BenchConfig, DiagnoseConfig, ProbeConfig, SpeedConfig
from .training import OptimConfig, TrainConfig
from .tree import Config

__all__ = [
    "ConfigError", "Config", "ModelConfig", "AudioEncoderConfig", "AudioAdaptorConfig",
    "LLMConfig", "LoraConfig", "DataConfig", "AutoBatchConfig", "OptimConfig", "TrainConfig", "SpeedConfig",
    "DiagnoseConfig", "ProbeConfig", "BenchArm", "BenchConfig", "build_config", "did_you_mean", "leaf_keys",
    "optional_keys", "parse_override", "load_config", "save_config", "config_changes", "check_files", "data_path",
    "get_dotted", "read_yaml", "shipped_config", "shipped_data", "shipped_names", "yaml_error", "SHIPPED", "BUNDLED",
    "_known_path", "_set_dotted", "_merge",
]
