"""train.average_best=N: the average of the N best checkpoints' weights, as FunASR's recipe ships its model.

FunASR (funasr/train_utils/average_nbest_models.py, ``average_checkpoints``) loads each checkpoint's
``state_dict`` and, key by key, takes ``torch.mean(torch.stack(tensors))`` in the tensor's own dtype, and sums
integer tensors. brisk differs in two places, both so that the average of identical checkpoints is that
checkpoint, bit for bit: floating tensors are summed in float32 (float64 for float64) and cast back to their
dtype once; integer tensors (counters, not weights) are taken from the best checkpoint.

Only what trains is averaged: with train.frozen_ref each checkpoint holds its trained tensors and references
the frozen ones (written once, brisk.models.build.read_checkpoint); the average holds the mean of the trained
tensors and the same reference, so a LoRA run averages its adapters and nothing else is read twice. Without
frozen_ref every tensor is in every file; the frozen ones are equal in all of them and average to themselves.

The checkpoints are read one at a time (a running float32 sum), so memory holds one checkpoint and the sum.
The file, ``checkpoints/avg-best<N>.pt``, is FunASR's {"state_dict": ...} layout plus the list of checkpoints
it averages (``averaged``) and the metric they were ranked by; it is not in index.json, so pruning never
removes it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..files import atomic_save
from ..formats.run_folder import ranked
from ..models.build import FROZEN_REF_KEY, read_checkpoint
from ..safe_load import load_torch_file

log = logging.getLogger("brisk")


def _stored(path: Path) -> dict:
    """A checkpoint as written: its trained tensors, and the frozen-weights reference if it has one."""
    obj = load_torch_file(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("state_dict"), dict):
        raise ValueError(f"{path}: no state_dict to average")
    return obj


def average_state_dicts(states) -> dict[str, torch.Tensor]:
    """The key-by-key mean of an iterable of state dicts (same keys, shapes and dtypes; checked), read one at a
    time. Floating tensors: summed in float32 (float64 stays float64), divided, cast back to their dtype;
    integer and bool tensors: the first state dict's."""
    total: dict[str, torch.Tensor] = {}
    first: dict[str, torch.Tensor] = {}
    n = 0
    for sd in states:
        if n == 0:
            first = sd
            for k, v in sd.items():
                if v.is_floating_point():
                    total[k] = v.detach().to("cpu", torch.float64 if v.dtype == torch.float64 else torch.float32,
                                             copy=True)
        else:
            if sd.keys() != first.keys():
                missing, extra = sorted(first.keys() - sd.keys()), sorted(sd.keys() - first.keys())
                raise ValueError(f"checkpoints to average hold other keys (missing {missing[:3]}, extra {extra[:3]})")
            for k, acc in total.items():
                v = sd[k]
                if v.shape != first[k].shape or v.dtype != first[k].dtype:
                    raise ValueError(f"{k}: shape or dtype differs between the checkpoints to average")
                acc.add_(v.detach().to("cpu", acc.dtype))
        n += 1
    if n == 0:
        raise ValueError("no checkpoints to average")
    return {k: (total[k].div_(n).to(v.dtype) if k in total else v) for k, v in first.items()}


def average_files(paths: list[Path]) -> dict:
    """The averaged checkpoint of ``paths`` (best first): {"state_dict": mean of their stored tensors, and the
    best one's frozen-weights reference and key order when they have one}. Checkpoints that reference frozen
    weights must all reference the same file."""
    heads = []

    def trained():
        for p in paths:
            obj = _stored(p)
            heads.append({k: obj.get(k) for k in (FROZEN_REF_KEY, "state_dict_keys")})
            yield obj["state_dict"]

    sd = average_state_dicts(trained())
    refs = {json.dumps(h[FROZEN_REF_KEY], sort_keys=True) for h in heads}
    if len(refs) > 1:
        raise ValueError(f"the checkpoints to average reference different frozen weights: {[str(p) for p in paths]}")
    out = {"state_dict": sd}
    if heads[0][FROZEN_REF_KEY] is not None:
        out[FROZEN_REF_KEY] = heads[0][FROZEN_REF_KEY]
        out["state_dict_keys"] = heads[0]["state_dict_keys"]
    return out


def best_checkpoints(folder: Path, n: int, metric: str) -> list[Path]:
    """The ``n`` best checkpoints in ``folder`` (its index.json) by validation ``metric``, best first."""
    index_path = folder / "index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    present = {k: e for k, e in index.items() if (folder / k).is_file()}
    return [folder / name for name in ranked(present, metric)[:n]]


def write_average(folder: Path, n: int, metric: str) -> tuple[Path, list[Path]] | None:
    """Average the ``n`` best checkpoints of ``folder`` by ``metric`` into ``folder/avg-best<n>.pt``.
    Returns (the file, the checkpoints in it), or None when no checkpoint has that validation metric."""
    paths = best_checkpoints(folder, n, metric)
    if not paths:
        log.warning("train.average_best=%d: no checkpoint has a validation %s; nothing averaged", n, metric)
        return None
    if len(paths) < n:
        log.warning("train.average_best=%d: only %d checkpoint(s) have a validation %s; averaging those", n,
                    len(paths), metric)
    obj = average_files(paths)
    obj["averaged"] = [p.name for p in paths]
    obj["metric"] = metric
    out = folder / f"avg-best{n}.pt"
    atomic_save(obj, out, True)
    log.info("train.average_best=%d: averaged %s (best first by validation %s) into %s", n,
             ", ".join(p.name for p in paths), metric, out)
    return out, paths


def load_average(path: Path) -> dict[str, torch.Tensor]:
    """The averaged weights, frozen ones merged back (brisk.models.build.read_checkpoint)."""
    return read_checkpoint(path)["state_dict"]


def average_metric(cfg) -> str:
    """What the checkpoints are ranked by for the average: CER when the run decodes at validation, else keep_metric."""
    return "cer" if cfg.train.val_decode else cfg.train.keep_metric


def use_average(trainer, cfg) -> dict[str, torch.Tensor] | None:
    """End of a run with train.average_best: rank 0 writes the average; every rank loads it into the model and
    validates it (a collective under DDP); the result goes to checkpoints/avg-best<N>.json. Returns the averaged
    state dict (for the export), or None when nothing was averaged."""
    from ..distributed.ranks import broadcast_from_rank0
    from ..speed.flags import run_scope

    n = cfg.train.average_best
    metric = average_metric(cfg)
    made = write_average(trainer.ckpts.dir, n, metric) if trainer.ckpts is not None else None
    path = broadcast_from_rank0(str(made[0]) if made else None)
    if path is None:
        return None
    state = load_average(Path(path))
    trainer.model.load_state_dict(state)
    if trainer.parts.accel.audio is not None:
        trainer.parts.accel.audio.refresh()  # compute copies of the frozen encoder follow the loaded weights
    val = None
    if trainer.valid is not None:
        with torch.no_grad(), run_scope(cfg), trainer.parts.accel.eval_context():
            val = trainer.measure(tag=Path(path).name)
        log.info("validation of %s: loss %.4f  acc %.4f%s", Path(path).name, val["loss"], val["acc"],
                 f"  CER {100 * val['cer']:.2f}%  WER {100 * val['wer']:.2f}%" if "cer" in val else "")
    if made is not None:
        record = {"file": made[0].name, "averaged": [p.name for p in made[1]], "metric": metric, "validation": val}
        (made[0].with_suffix(".json")).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    trainer.close_data()  # the validation loader's workers, started again by the measurement
    return state
