"""train.average_best: the mean of the n best checkpoints, saved beside them, validated, exported."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from brisk.config import ConfigError
from brisk.formats.run_folder import ranked
from brisk.models.build import read_checkpoint, read_state_dict
from brisk.train.async_save import AsyncCheckpointer
from brisk.train.average import average_state_dicts, write_average
from brisk.train.checkpoint import Checkpoints

from .conftest import run_train, tiny_config


def _state():
    torch.manual_seed(0)
    return {"w": torch.randn(4, 3), "h": torch.randn(5).to(torch.bfloat16), "d": torch.randn(2, dtype=torch.float64),
            "count": torch.tensor(7), "flag": torch.tensor([True, False])}


def test_average_of_identical_checkpoints_is_that_checkpoint():
    sd = _state()
    avg = average_state_dicts([dict(sd) for _ in range(5)])
    assert list(avg) == list(sd)
    for k in sd:
        assert avg[k].dtype == sd[k].dtype and torch.equal(avg[k], sd[k]), k


def test_average_is_the_mean_in_float32_cast_back():
    a, b, c = _state(), _state(), _state()
    b["w"], c["w"] = a["w"] + 1.0, a["w"] + 2.0
    b["h"] = (a["h"].float() * 3).to(torch.bfloat16)
    b["count"] = torch.tensor(100)  # integer tensors: the best (first) checkpoint's
    avg = average_state_dicts([a, b, c])
    assert torch.allclose(avg["w"], a["w"] + 1.0, atol=1e-6)
    want_h = ((a["h"].float() + b["h"].float() + c["h"].float()) / 3).to(torch.bfloat16)
    assert avg["h"].dtype == torch.bfloat16 and torch.equal(avg["h"], want_h)
    assert int(avg["count"]) == 7


def test_mismatched_checkpoints_are_refused():
    a, b = _state(), _state()
    del b["d"]
    with pytest.raises(ValueError, match="other keys"):
        average_state_dicts([a, b])
    b = _state()
    b["w"] = b["w"].double()
    with pytest.raises(ValueError, match="shape or dtype"):
        average_state_dicts([a, b])


def test_average_of_the_n_best_by_metric_keeps_the_frozen_reference(tmp_path):
    """Frozen weights stored once (train.frozen_ref): the average holds only the trained tensors' mean and the
    reference; read back, the frozen ones are the model's, the trained ones the mean of the 2 best."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)  # frozen: stored once, referenced
    saver = AsyncCheckpointer(Checkpoints(tmp_path, 3, "loss"), model, torch.device("cpu"), asynchronous=False)
    weights = {}
    for step, loss in [(1, 3.0), (2, 1.0), (3, 2.0)]:
        with torch.no_grad():
            model[1].weight.fill_(float(step))
        weights[step] = model[1].weight.clone()
        saver.save({"state_dict": model.state_dict()}, step, {"loss": loss, "acc": 0.0})
    saver.close()
    path, used = write_average(tmp_path / "checkpoints", 2, "loss")
    assert [p.name for p in used] == ["ckpt-00000002.pt", "ckpt-00000003.pt"]  # the best by loss first
    raw = torch.load(path, weights_only=True)
    assert set(raw["state_dict"]) == {"1.weight", "1.bias"} and raw["averaged"] == [p.name for p in used]
    merged = read_checkpoint(path)["state_dict"]
    assert list(merged) == list(model.state_dict())
    assert torch.equal(merged["0.weight"], model[0].weight) and torch.equal(merged["1.weight"], torch.full((2, 3), 2.5))


def test_average_best_over_keep_n_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="train.average_best=4.*keep_n"):
        tiny_config(tmp_path, **{"train.average_best": 4, "train.keep_n": 3})


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_a_run_exports_the_average_of_its_best_checkpoints(tmp_path, workers):
    """A tiny run validating and saving every 4 steps: the export holds the average of the 2 best checkpoints. With
    a loader worker (the demo's data.num_workers) the validation of the average starts the workers again."""
    run = tmp_path / "run"
    run_train(run, **{"train.max_steps": 12, "train.val_every": 4, "train.save_every": 4, "train.keep_n": 2,
                      "train.average_best": 2, "train.export": "funasr", "data.num_workers": workers})
    ck = run / "checkpoints"
    record = json.loads((ck / "avg-best2.json").read_text())
    index = json.loads((ck / "index.json").read_text())
    assert record["metric"] == "cer"  # the demo decodes at validation (train.val_decode): ranked by CER
    assert record["averaged"] == ranked(index, "cer")[:2] and len(record["averaged"]) == 2
    assert record["validation"]["loss"] > 0 and "cer" in record["validation"]
    parts = [read_checkpoint(ck / n)["state_dict"] for n in record["averaged"]]
    want = average_state_dicts(parts)
    exported = read_state_dict(run / "model-funasr" / "model.pt")
    assert set(exported) <= set(want)
    differs = 0
    for k, v in exported.items():
        assert torch.equal(v, want[k].to(v.dtype)), k
        differs += not torch.equal(parts[0][k].to(v.dtype), parts[1][k].to(v.dtype))
    assert differs  # the two checkpoints differ, so the export is not simply one of them
