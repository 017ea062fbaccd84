"""Model folders that others load: FunASR's (``funasr.AutoModel``) and transformers' native Fun-ASR-Nano.

    export_folder(model, cfg, out, fmt="funasr"|"hf", dtype="bf16"|"fp32", tokenizer=None) -> Path

Each folder is written under a temporary name beside ``out`` and renamed into place, so a crash never leaves
a half-written folder. The weights are read from ``model.state_dict()`` (the model's own, original weights).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..adapters.lora import is_lora_key
from ..config import Config, ConfigError, get_dotted
from ..config.roles import exported_keys
from ..families import get as get_family
from ..formats.brisk_keys import KEYS_FILE, inference_keys
from ..files import SYNCER, ensure_free, fsync_dir, fsync_file, no_crc32, share_modes, tensor_bytes
from .lm import DTYPES

log = logging.getLogger("brisk")


def export_folder(model, cfg: Config, out: str | Path, fmt: str = "funasr", dtype: str = "bf16",
                  tokenizer=None, state: dict | None = None, sync: bool = True) -> Path:
    """Write a model folder of ``fmt``; ``state``: the full state dict when the model holds only shards (FSDP).
    ``sync``: on the disk (fsync) before the folder is renamed into place; else renamed at once and fsynced
    in the background (brisk.files.SYNCER), as the end of a training run does."""
    if dtype not in DTYPES:
        raise ConfigError(f"export dtype {dtype!r}: use bf16 or fp32")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if tokenizer is None:
            from ..data.loader import load_tokenizer

            tokenizer = load_tokenizer(cfg)
        state = _converted_state(model, DTYPES[dtype], state)
        ensure_free(out.parent, tensor_bytes(state), f"the {fmt} export")
        family = get_family(cfg.model.family)
        if fmt not in family.exporters:
            raise ConfigError(f"export format {fmt}: model.family={family.name} writes {', '.join(family.exporters)}")
        with no_crc32():
            family.exporters[fmt](model, cfg, state, tmp, dtype, tokenizer)
        write_inference_keys(tmp, cfg)
        family.readme(tmp, fmt, dtype, cfg)
        share_modes(tmp)  # mkdtemp made it 0o700: a model folder is for sharing
        if sync:  # torch.save and save_file do not fsync: the data is on disk before the rename
            for f in tmp.rglob("*"):
                if f.is_file():
                    fsync_file(f)
        _replace(tmp, out)
        if sync:
            fsync_dir(out.parent)
        else:
            SYNCER.submit([f for f in sorted(out.rglob("*")) if f.is_file()])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    sizes = {p.relative_to(out).as_posix(): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    log.info("exported %s folder %s (%s, %.1f MB): %s", fmt, out, dtype, sum(sizes.values()) / 1e6,
             ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items() if v > 1e6) or "all files under 1 MB")
    return out


def _converted_state(model, dtype: torch.dtype, state: dict | None = None) -> dict[str, torch.Tensor]:
    """model.state_dict() on the CPU in ``dtype``; tensors that share storage (a tied lm_head) stay shared, so
    torch.save writes them once, as FunASR's own model.pt does. LoRA adapters wider than ``dtype``
    (model.llm.lora.dtype=fp32) stay as they are: folding them (fold_lora) then rounds once, to the weight's
    ``dtype``; a writer that keeps them casts them itself."""
    done: dict[tuple, torch.Tensor] = {}
    out = {}
    for k, v in (state if state is not None else model.state_dict()).items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        if key not in done:
            wider = is_lora_key(k) and v.dtype.itemsize > dtype.itemsize
            done[key] = v.detach().to("cpu", v.dtype if wider else dtype).contiguous()
        out[k] = done[key]
    return out


def _replace(tmp: Path, out: Path) -> None:
    """Rename tmp to out; an existing out is moved aside first and removed only after the rename."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_inference_keys(out: Path, cfg: Config) -> None:
    """brisk.json, and the files it names (CMVN, a chat template) copied into the folder: what the run computed
    with travels with the model (brisk.formats.brisk_keys; the keys are those declared to change it)."""
    tree, declared = cfg.to_dict(), exported_keys()
    keys = inference_keys(tree, cfg.model.family, declared)
    for key in keys["files"]:  # each under its name in the folder, as brisk.json names it
        src = get_dotted(tree, key)
        if not Path(src).is_file():
            raise ConfigError(f"{key}={src}: the file is gone; the export needs it (it changes what the model computes)")
        shutil.copyfile(src, out / declared[key])
    (out / KEYS_FILE).write_text(json.dumps(keys, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------ README
