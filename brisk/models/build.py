"""What every family's builder shares: the transformers LLM from model.llm, LoRA adapters, activation
checkpointing, and reading weights (brisk checkpoints, .pt and .safetensors files) into a built model.

Everything is read from local paths; nothing is downloaded.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from ..adapters.lora import apply_lora, is_lora_key, load_lora_weights
from ..config import Config, ConfigError, ModelConfig
from ..files import file_sha256
from ..safe_load import load_torch_file
from .kernel_router import without_kernel_router

log = logging.getLogger("brisk")


def build_llm(cfg: ModelConfig, dtype: torch.dtype | None = None) -> nn.Module:
    """A transformers causal LM from a local folder (config.json) or an inline config, random weights (made in
    ``dtype`` when given, else in torch's default dtype), without transformers' hub-kernel router
    (brisk.models.kernel_router)."""
    from transformers import AutoModelForCausalLM

    llm = AutoModelForCausalLM.from_config(llm_hf_config(cfg.llm), **({"dtype": dtype} if dtype else {}))
    without_kernel_router(llm)
    return llm


def llm_hf_config(llm):
    """The transformers config of model.llm: its folder's config.json with model.llm.config's keys set on top, or
    model.llm.config alone (with its model_type)."""
    from transformers import AutoConfig

    if llm.path:
        hf_cfg = AutoConfig.from_pretrained(llm.path, local_files_only=True)
        _set_on(hf_cfg, llm.config)
        return hf_cfg
    if "model_type" not in llm.config:
        raise ConfigError("model.llm: give model.llm.path (a local folder) or model.llm.config with a model_type")
    extra = dict(llm.config)
    return AutoConfig.for_model(extra.pop("model_type"), **extra)


def _set_on(hf_cfg, keys: dict) -> None:
    """model.llm.config's keys on a folder's config: a dict for a sub-config (Qwen3-ASR's audio_config and
    text_config) sets its keys on that sub-config, which stays a config object (transformers reads its attributes)."""
    for k, v in keys.items():
        sub = getattr(hf_cfg, k, None)
        if isinstance(v, dict) and hasattr(sub, "to_dict"):
            _set_on(sub, {kk: vv for kk, vv in v.items() if kk != "model_type"})
        else:
            setattr(hf_cfg, k, v)


def build_model(cfg: Config, device: torch.device | str | None = None) -> nn.Module:
    """The model of ``cfg.model.family``, built by that family's builder."""
    from ..families import get

    return get(cfg.model.family).build(cfg, device)


def with_adapters(model: nn.Module, cfg: ModelConfig) -> nn.Module:
    """Adapters go in before any weights are loaded, so that a file holding them fills them too."""
    note = apply_lora(model, cfg.llm.lora)
    if cfg.llm.lora.enabled:
        log.info(note)
    return model


def after_loading(model: nn.Module, cfg: ModelConfig) -> nn.Module:
    """After every weight is loaded: the adapters' own start (model.llm.lora.init_path wins over a model file's
    adapters), then activation checkpointing (its layers keep the parameter names, so nothing else changes)."""
    from ..memory.checkpointing import apply_activation_checkpointing

    if cfg.llm.lora.enabled and cfg.llm.lora.init_path:
        load_lora_weights(model, read_state_dict(Path(cfg.llm.lora.init_path)), Path(cfg.llm.lora.init_path))

    note = apply_activation_checkpointing(model, cfg)
    if cfg.llm.activation_checkpoint or cfg.encoder.activation_checkpoint:
        log.info(note)
    return model


def has_hf_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors"))


def load_hf_llm_weights(model: nn.Module, folder: Path) -> None:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(f)))
    missing, unexpected = model.llm.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not is_lora_key(k)]  # tied; adapters start fresh
    if missing or unexpected:
        raise ConfigError(f"{folder}: LLM weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    log.info("loaded LLM weights from %s", folder)


# ------------------------------------------------------------------------------------------ weights
FROZEN_REF_KEY = "frozen_ref"  # a checkpoint's reference to frozen weights stored once (train.frozen_ref)


def read_checkpoint(path: Path) -> dict:
    """Read a checkpoint (as data: brisk.safe_load); frozen weights it references are verified (sha256) and merged back.

    The reference names a file beside the checkpoint; a missing file or a different hash is an error,
    never a silent partial load.
    """
    obj = load_torch_file(path)  # data only: a file that needs code to load is refused (brisk.safe_load)
    ref = obj.pop(FROZEN_REF_KEY, None) if isinstance(obj, dict) else None
    if ref is None:
        return obj
    frozen = Path(path).parent / ref["file"]
    if not frozen.is_file():
        raise ConfigError(f"{path}: references frozen weights {frozen}, which do not exist (copy them beside it)")
    if file_sha256(frozen) != ref["sha256"]:
        raise ConfigError(f"{path}: frozen weights {frozen} do not match the checkpoint's hash (changed or damaged)")
    weights = load_torch_file(frozen)
    if sorted(weights) != sorted(ref["keys"]):
        raise ConfigError(f"{path}: frozen weights {frozen} hold other keys than the checkpoint references")
    merged = {**obj["state_dict"], **weights}
    obj["state_dict"] = {k: merged[k] for k in obj.pop("state_dict_keys", merged)}  # the model's own key order
    return obj


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A FunASR model.pt, a brisk checkpoint, or a .safetensors file -> flat state dict."""
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    obj = read_checkpoint(path)
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    return {k.removeprefix("module."): v for k, v in obj.items()}


def check_shapes(model: nn.Module, state: dict, path: Path) -> None:
    own = model.state_dict()
    for k, v in state.items():
        if k in own and own[k].shape != v.shape:
            raise ConfigError(f"{path}: {k} has shape {tuple(v.shape)}, the model expects {tuple(own[k].shape)}")


def load_weights(model: nn.Module, path: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """Load ``path`` (or ``state``, read from there) strictly: every key, every shape."""
    state = read_state_dict(path) if state is None else state
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    # A tied lm_head may be stored once; everything else must match exactly, except that a file without any
    # adapter (a base model to fine-tune with LoRA) leaves the adapters at their initialisation.
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if not any(is_lora_key(k) for k in state):
        missing = [k for k in missing if not is_lora_key(k)]
    if missing or unexpected:
        if any(is_lora_key(k) for k in unexpected):
            first = next(k for k in unexpected if is_lora_key(k))
            raise ConfigError(f"{path}: holds LoRA adapters ({first}, ...) the model has not: set model.llm.lora "
                              "(enabled=true, the r and target_modules they were trained with)")
        raise ConfigError(
            f"{path}: keys do not match the model built from the config: "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}). "
            "Check the model's sizes (model.llm, the family's own section) against the checkpoint."
        )
    check_shapes(model, state, path)
    model.load_state_dict(state, strict=False)
    log.info("loaded %d tensors from %s", len(state), path)


STALE_TEMPS = (".model-funasr.*", ".model-hf.*")  # export temp folders a crash can leave in a run folder
