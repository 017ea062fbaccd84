"""FunASR's formats: a Fun-ASR-Nano model folder's config.yaml read into brisk's keys, and the number of audio
slots FunASR's prompt holds for an utterance."""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import ConfigError

FAMILY = "fun_asr_nano"  # the config section a FunASR folder's sizes and front end go to


def audio_token_count(lfr_frames: int, use_low_frame_rate: bool = True) -> int:
    """How many adaptor outputs reach the LLM: ceil(ceil(ceil(L/2)/2)/2) with low frame rate, else L."""
    if not use_low_frame_rate:
        return lfr_frames
    n = lfr_frames
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


# ------------------------------------------------------------------------------ FunASR model folder
def _folder_yaml(folder: Path) -> dict:
    cfg_file = folder / "config.yaml"
    if not folder.is_dir():
        raise ConfigError(f"model.path={folder}: no such folder (give the local folder of a FunASR model, with its "
                          "config.yaml and model.pt)")
    if not cfg_file.is_file():
        raise ConfigError(f"model.path={folder}: no config.yaml there (expected a FunASR model folder)")
    return yaml.safe_load(cfg_file.read_text(encoding="utf-8")) or {}


# FunASR dataset_conf key -> brisk data key: what shapes the tokens FunASR's dataset produces.
DATASET_KEYS = {"prompt_classes": "prompt_class", "prompt_conf": "prompt_conf", "sys_prompt": "sys_prompt",
                "do_think": "do_think", "multiturn_num_max": "multiturn_max", "max_token_length": "max_token_length"}


def funasr_folder_data_config(folder: str | Path) -> dict:
    """The data keys a FunASR model folder's ``dataset_conf`` sets (context header, system prompt, think tags)."""
    folder = Path(folder)
    conf = _folder_yaml(folder).get("dataset_conf") or {}
    out = {ours: conf[theirs] for theirs, ours in DATASET_KEYS.items() if theirs in conf}
    if out.get("prompt_conf") is None:
        out.pop("prompt_conf", None)
    for key in ("chinese_hotwords_list", "english_hotwords_list"):  # relative to the folder, like init_param_path
        p = (out.get("prompt_conf") or {}).get(key)
        if p and not Path(p).is_absolute():
            out["prompt_conf"] = {**out["prompt_conf"], key: str(folder / p)}
    return out


# FunASR lora_conf key -> brisk model.llm.lora key. FunASR 1.4.16 reads r, lora_alpha, lora_dropout and
# target_modules from lora_conf, and lora_only / lora_bias from the top level; freeze_lora, task_type and
# lora_conf.bias are carried by real configs but not read by it (nor here).
LORA_KEYS = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "target_modules": "target_modules",
             "init_param_path": "init_path"}


def funasr_lora_config(raw: dict, folder: Path) -> dict:
    """model.llm.lora keys from a FunASR config.yaml (llm_conf.use_lora, llm_conf.lora_conf, lora_only, lora_bias)."""
    llm = raw.get("llm_conf") or {}
    conf = llm.get("lora_conf") or {}
    out = {ours: conf[theirs] for theirs, ours in LORA_KEYS.items() if theirs in conf}
    if not out.get("init_path"):
        out.pop("init_path", None)
    elif not Path(out["init_path"]).is_absolute():
        out["init_path"] = str(folder / out["init_path"])
    if "use_lora" in llm:
        out["enabled"] = bool(llm["use_lora"])
    if "lora_only" in raw:
        out["only"] = bool(raw["lora_only"])
    if "lora_bias" in raw:
        out["bias"] = raw["lora_bias"]
    return out


def funasr_folder_config(folder: str | Path) -> dict:
    """Map a FunASR model folder's config.yaml onto brisk's keys: {"model": what trains and the LLM,
    "fun_asr_nano": the sizes, front end and CTC branch}."""
    folder = Path(folder)
    raw = _folder_yaml(folder)
    out: dict = {}
    own: dict = {}
    enc = raw.get("audio_encoder_conf") or {}
    own["encoder"] = {k2: enc[k1] for k1, k2 in [
        ("output_size", "output_size"), ("attention_heads", "attention_heads"), ("linear_units", "linear_units"),
        ("num_blocks", "num_blocks"), ("tp_blocks", "tp_blocks"), ("kernel_size", "kernel_size"),
        ("sanm_shfit", "sanm_shift"), ("dropout_rate", "dropout_rate"),
        ("attention_dropout_rate", "attention_dropout_rate")] if k1 in enc}
    out["encoder"] = {"freeze": enc["freeze"]} if "freeze" in enc else {}
    ad = raw.get("audio_adaptor_conf") or {}
    own["adaptor"] = {k: ad[k] for k in ("downsample_rate", "ffn_dim", "n_layer", "attention_heads", "dropout_rate",
                                          "use_low_frame_rate") if k in ad}
    out["adaptor"] = {"freeze": ad["freeze"]} if "freeze" in ad else {}
    llm = raw.get("llm_conf") or {}
    out["llm"] = {}
    if llm.get("init_param_path"):
        p = Path(llm["init_param_path"])
        out["llm"]["path"] = str(p if p.is_absolute() else folder / p)
    if "llm_dtype" in llm:
        out["llm"]["dtype"] = {"bfloat16": "bf16", "float32": "fp32"}.get(llm["llm_dtype"], llm["llm_dtype"])
    if "freeze" in llm:
        out["llm"]["freeze"] = llm["freeze"]
    lora = funasr_lora_config(raw, folder)
    if lora:
        out["llm"]["lora"] = lora
    for part, conf in (("llm", llm), ("encoder", enc)):
        if "activation_checkpoint" in conf:  # FunASR: a bool (every layer); brisk: every k-th layer, 0 off
            out[part]["activation_checkpoint"] = int(conf["activation_checkpoint"])
    fe = raw.get("frontend_conf") or {}
    own["frontend"] = {k: fe[k] for k in ("fs", "n_mels", "frame_length", "frame_shift", "window", "lfr_m", "lfr_n",
                                           "dither") if k in fe}
    if fe.get("cmvn_file"):
        own["frontend"]["cmvn_file"] = str(folder / fe["cmvn_file"])
    if raw.get("ctc_decoder"):
        cd = raw.get("ctc_decoder_conf") or {}
        own["ctc"] = {"enabled": True, **{k2: cd[k1] for k1, k2 in [("n_layer", "n_layer"), ("ffn_dim", "ffn_dim"),
                      ("llm_dim", "dim"), ("downsample_rate", "downsample_rate"), ("freeze", "freeze")] if k1 in cd}}
        if "ctc_vocab_size" in raw:
            own["ctc"]["vocab_size"] = raw["ctc_vocab_size"]
    return {"model": out, FAMILY: own}

