"""Several processes: device choice under torchrun, rank-synced static shapes, 2 ranks == 1 rank (gloo, CPU)."""

from __future__ import annotations

import pytest
import torch

from brisk.config import ConfigError
from brisk.train.run import pick_device


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def _env(monkeypatch, world: int, local: int) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_RANK", str(local))


@pytest.mark.parametrize("name", ["cuda", "auto", "cuda:1"])
def test_cuda_under_torchrun_is_this_ranks_gpu(monkeypatch, two_gpus, name):
    _env(monkeypatch, 2, 1)
    assert pick_device(name) == torch.device("cuda", 1)


def test_single_process_keeps_the_named_device(monkeypatch, two_gpus):
    _env(monkeypatch, 1, 0)
    assert pick_device("cuda") == torch.device("cuda")
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert pick_device("auto") == torch.device("cuda")
    assert pick_device("cpu") == torch.device("cpu")


def test_device_errors_name_the_key(monkeypatch, two_gpus):
    _env(monkeypatch, 2, 1)
    with pytest.raises(ConfigError, match="LOCAL_RANK=1 owns cuda:1"):
        pick_device("cuda:0")
    _env(monkeypatch, 1, 0)
    with pytest.raises(ConfigError, match="only 2 CUDA device"):
        pick_device("cuda:5")
    with pytest.raises(ConfigError, match="train.device='gpu'"):
        pick_device("gpu")


def test_no_cuda_under_torchrun(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _env(monkeypatch, 2, 0)
    assert pick_device("auto") == torch.device("cpu")  # gloo ranks on the CPU
    with pytest.raises(ConfigError, match="no CUDA device"):
        pick_device("cuda")


# ------------------------------------------------------------------------------- rank-synced buckets
def _spawn(fn, tmp_path, *args, world: int = 2) -> None:
    """Run fn(rank, world, init_file, *args) in ``world`` gloo processes."""
    import torch.multiprocessing as mp

    mp.spawn(fn, args=(world, str(tmp_path / "pg_init"), *args), nprocs=world, join=True)


def _init(rank: int, world: int, init_file: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def _static_setup(run_dir):
    from brisk.data.dataset import SyntheticDataset
    from brisk.models.build import build_model
    from brisk.speed import collator_for

    from .conftest import tiny_config

    cfg = tiny_config(run_dir, **{"speed.packing": True, "speed.cuda_graph": True, "speed.frozen_eval": True,
                                  "model.encoder.dropout_rate": 0.0, "model.encoder.freeze": True,
                                  "model.adaptor.freeze": True})
    fe = cfg.model.frontend
    vocab = int(cfg.model.llm.config["vocab_size"])
    # Rank 0 gets one short utterance, rank 1 two long ones: different token and speech buckets.
    rows = {0: [(500, 20)], 1: [(2500, 150), (1800, 120)]}
    data = {r: SyntheticDataset(rows[r], fe.n_mels * fe.lfr_m, vocab, fe.lfr_n, seed=r) for r in rows}
    model = build_model(cfg.model).eval()
    return cfg, collator_for(cfg), data, model


def _shape_sync_worker(rank, world, init_file, run_dir, out_file):
    import json

    from brisk.train.dist import ShapeSync
    from brisk.train.step import StepHooks, model_loss

    _init(rank, world, init_file)
    try:
        _, collator, data, model = _static_setup(run_dir)
        ds = data[rank]
        batch = collator([ds[i] for i in range(len(ds))])
        synced = ShapeSync()(batch)
        keys = [None] * world
        torch.distributed.all_gather_object(keys, synced.shape_key())
        with torch.no_grad():
            before = model_loss(model, batch, StepHooks())
            after = model_loss(model, synced, StepHooks())
        with open(f"{out_file}.{rank}", "w") as f:
            json.dump({"keys": keys, "own": list(batch.shape_key()), "loss": [float(before[1]), float(after[1])],
                       "count": [int(before[3]), int(after[3])], "correct": [int(before[2]), int(after[2])]}, f)
    finally:
        torch.distributed.destroy_process_group()


def test_ranks_with_different_batches_get_identical_shapes(tmp_path):
    import json

    _spawn(_shape_sync_worker, tmp_path, str(tmp_path / "run"), str(tmp_path / "out"))
    res = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert res[0]["own"] != res[1]["own"]  # the collator alone gives the ranks different shapes
    assert res[0]["keys"][0] == res[0]["keys"][1] == res[1]["keys"][0]  # after the sync: one shape
    # The common shape is rank 1's (the larger batch); rank 0's batch grew, and what it computes did not change.
    assert res[0]["keys"][0] == res[1]["own"]
    for r in res:
        assert r["count"][0] == r["count"][1] and r["correct"][0] == r["correct"][1]
        assert abs(r["loss"][0] - r["loss"][1]) <= 1e-5 * abs(r["loss"][0]), r["loss"]


def test_pad_static_refuses_to_shrink(tmp_path):
    from brisk.data.collate import pad_static, static_needs

    _, collator, data, _ = _static_setup(tmp_path)
    batch = collator([data[1][0], data[1][1]])
    t, f, n, c = static_needs(batch)
    assert pad_static(batch, t, f, n, c) is batch
    with pytest.raises(ValueError, match="cannot shrink"):
        pad_static(batch, t - 1, f, n, c)
