"""Several processes: device choice under torchrun, rank-synced static shapes, 2 ranks == 1 rank (gloo, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from brisk.models.build import read_checkpoint

from brisk.config import ConfigError
from brisk.distributed.ranks import pick_device
from brisk.families import section


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
    from datetime import timedelta

    # A rank left waiting (a regression in who-waits-for-whom) fails the test in minutes instead of hanging it.
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                         timeout=timedelta(seconds=90))


def _close() -> None:
    """Both ranks meet before tearing the group down: a rank that closes while the other's gloo threads still
    talk to it aborts that process ("terminate called without an active exception"; seen under CPU load)."""
    import gc

    gc.collect()  # objects in reference cycles that hold the group (a DDP wrapper) go while both ranks are alive
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _static_setup(run_dir):
    from brisk.families.fun_asr_nano.dataset import SyntheticDataset
    from brisk.models.build import build_model
    from brisk.data.collate import collator_for

    from .conftest import tiny_config

    cfg = tiny_config(run_dir, **{"speed.packing": True, "speed.cuda_graph": True, "speed.frozen_eval": True,
                                  "fun_asr_nano.encoder.dropout_rate": 0.0, "model.encoder.freeze": True,
                                  "model.adaptor.freeze": True})
    fe = section(cfg).frontend
    vocab = int(cfg.model.llm.config["vocab_size"])
    # Rank 0 gets one short utterance, rank 1 two long ones: different token and speech buckets.
    rows = {0: [(500, 20)], 1: [(2500, 150), (1800, 120)]}
    data = {r: SyntheticDataset(rows[r], fe.n_mels * fe.lfr_m, vocab, fe.lfr_n, seed=r) for r in rows}
    model = build_model(cfg).eval()
    return cfg, collator_for(cfg), data, model


def _shape_sync_worker(rank, world, init_file, run_dir, out_file):
    import json

    import dataclasses

    from brisk.distributed.sync import ShapeSync
    from brisk.speed.label_head import LabelHead
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
        # label_head's gathered rows (part of a graph's key): 64 of the bucket fit rank 0's labels, not rank 1's
        head = LabelHead(static=True, frac=64 / synced.input_ids.shape[1])
        alone = head.rows(dataclasses.replace(synced, label_rows_floor=0))
        with open(f"{out_file}.{rank}", "w") as f:
            json.dump({"keys": keys, "own": list(batch.shape_key()), "loss": [float(before[1]), float(after[1])],
                       "count": [int(before[3]), int(after[3])], "correct": [int(before[2]), int(after[2])],
                       "labelled": batch.n_label_tokens, "floor": synced.label_rows_floor,
                       "rows": [alone, head.rows(synced)]}, f)
    finally:
        _close()


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
    # label_head's rows: each rank alone would pick its own (rank 1 overflows 64 rows), synced they agree
    assert res[0]["labelled"] < 64 < res[1]["labelled"]
    assert res[0]["rows"][0] == 64 and res[1]["rows"][0] > 64
    assert res[0]["floor"] == res[1]["floor"] == res[1]["labelled"]
    assert res[0]["rows"][1] == res[1]["rows"][1] == res[1]["rows"][0]


def test_pad_static_refuses_to_shrink(tmp_path):
    from brisk.data.collate import pad_static, static_needs

    _, collator, data, _ = _static_setup(tmp_path)
    batch = collator([data[1][0], data[1][1]])
    t, f, n, c = static_needs(batch)
    assert pad_static(batch, t, f, n, c) is batch
    with pytest.raises(ValueError, match="cannot shrink"):
        pad_static(batch, t - 1, f, n, c)


# ------------------------------------------------------------------- gradients averaged like DDP's
class _TwoDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 5), torch.nn.Linear(5, 3).double()  # two dtypes: two flat buffers

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)).double())


def _ddp_grads(model, x) -> list[torch.Tensor]:
    """DDP's averaged gradients. The wrapper dies when this returns: alive (or left in a reference cycle) until
    interpreter exit, it keeps the gloo group's threads running past destroy_process_group."""
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(x).sum().backward()
    return [p.grad.clone() for p in ddp.module.parameters()]


def _grad_sync_worker(rank, world, init_file, out_file):
    import copy

    from brisk.distributed.sync import GradSync

    _init(rank, world, init_file)
    try:
        torch.manual_seed(0)
        model = _TwoDtypes()
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(10 + rank))  # each rank its own batch
        reference = _ddp_grads(copy.deepcopy(model), x)
        sync = GradSync(list(model.parameters()))
        for _ in range(2):  # twice: the views must survive zeroing and a second backward
            for p in model.parameters():
                p.grad.zero_()
            model(x).sum().backward()
            sync()
        views = all(any(p.grad.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for b in sync.buffers)
                    for p in model.parameters())
        diff = max(float((p.grad - r).abs().max()) for p, r in zip(model.parameters(), reference))
        torch.save({"views": views, "diff": diff, "buffers": len(sync.buffers)}, f"{out_file}.{rank}")
    finally:
        _close()


def test_grad_sync_averages_like_ddp(tmp_path):
    """GradSync (the graphed step's all-reduce) gives DDP's averaged gradients, on gloo."""
    _spawn(_grad_sync_worker, tmp_path, str(tmp_path / "out"))
    for r in range(2):
        res = torch.load(tmp_path / f"out.{r}")
        assert res["views"] and res["buffers"] == 2
        assert res["diff"] < 1e-6, res


# ------------------------------------------------------------ 2 ranks on halves == 1 rank on both
# Why this equality is exact in exact arithmetic: the loss is a token mean per batch. DDP averages the ranks'
# gradients, grad((L_a + L_b) / 2) for rank batches a and b; one process with train.accum_grad=2 over the same
# two batches computes grad(L_a / 2) + grad(L_b / 2), the same thing. The sampler deals batches round-robin
# (rank r gets batches r, r + 2, ...), so with one sort chunk for the whole set (sort_size >= the data) the
# accumulating process sees exactly the pairs the two ranks see. Its loss is the mean of the two ranks' losses;
# the union of the halves as one batch would weight the halves by their label tokens instead.
EQUAL = {"fun_asr_nano.encoder.dropout_rate": 0.0, "data.sort_size": 1000, "data.shuffle": False, "probe.enabled": True,
         "train.max_steps": 3, "optim.warmup_steps": 1, "data.valid": "", "train.val_every": 0}


def _read_probe(path):
    from brisk.probe.compare import load_record

    return load_record(path)


def test_two_ranks_on_halves_equal_one_rank_on_both(tmp_path):
    import subprocess
    import sys

    from brisk.cli import main

    from .conftest import DEMO_CONFIG, REPO, run_train, tiny_overrides

    two, one = tmp_path / "two", tmp_path / "one"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "brisk", "train",
           str(DEMO_CONFIG), *tiny_overrides(two, **EQUAL)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    run_train(one, **EQUAL, **{"train.accum_grad": 2})

    r0, r1, ref = (_read_probe(p) for p in (two / "probe.rank0.jsonl", two / "probe.rank1.jsonl", one / "probe.rank0.jsonl"))
    steps = [1, 2, 3]
    # The ranks trained on different batches ...
    assert all(r0[("batch.tokens", s)] != r1[("batch.tokens", s)] for s in steps)
    # ... and the single process saw both: its loss is the mean of theirs, its gradient theirs averaged.
    for s in steps:
        assert abs(ref[("loss", s)] - (r0[("loss", s)] + r1[("loss", s)]) / 2) <= 1e-5 * ref[("loss", s)]
        assert ref[("label_tokens", s)] == r0[("label_tokens", s)] + r1[("label_tokens", s)]
        for r in (r0, r1):
            assert abs(r[("grad_norm", s)] - ref[("grad_norm", s)]) <= 1e-5 * ref[("grad_norm", s)]
    # The probe says the same: the two ranks hold identical gradients and parameters (exact gates), and
    # rank 0 matches the single process within fp32 reordering (1e-5 relative).
    exact = tmp_path / "exact.yaml"
    exact.write_text("grad_norm: {rel: 1.0e-7}\n\"grad_norm.*\": {rel: 1.0e-6}\nparam_norm: {rel: 1.0e-7}\nskipped: {exact: true}\n")
    assert main(["probe", "compare", str(two / "probe.rank0.jsonl"), str(two / "probe.rank1.jsonl"),
                 "--tolerances", str(exact)]) == 0
    close = tmp_path / "close.yaml"
    close.write_text("grad_norm: {rel: 1.0e-5}\n\"grad_norm.*\": {rel: 1.0e-5}\nparam_norm: {rel: 1.0e-6}\nskipped: {exact: true}\n")
    assert main(["probe", "compare", str(one), str(two), "--tolerances", str(close)]) == 0
    # Parameters after 3 steps (the final checkpoints). Measured: 8.4e-6 max abs (Adam divides by sqrt(v), so
    # elements with tiny gradients turn fp32 reordering into visible update differences); the bound, 1e-4, is
    # 1/60 of the 3 steps' update size (3 x lr 2e-3), far below what a wrong average (x2 or x0.5) would move.
    pa = read_checkpoint(two / "checkpoints" / "ckpt-00000003.pt")["state_dict"]
    pb = read_checkpoint(one / "checkpoints" / "ckpt-00000003.pt")["state_dict"]
    assert pa.keys() == pb.keys()
    worst = max(float((pa[k].float() - pb[k].float()).abs().max()) for k in pa)
    assert worst <= 1e-4, worst
    # Per-rank diagnostics: each rank timed its steps; the report merges them.
    for name in ("steps.jsonl", "steps.rank1.jsonl"):
        assert len((two / name).read_text().splitlines()) == 3, name
    assert main(["report", str(two)]) == 0
    text = (two / "report.md").read_text()
    assert "## Ranks" in text and "| 1 | 3 |" in text and "slowest rank each step, 3 steps" in text


def test_report_merges_rank_files_and_tags_slow_steps(tmp_path):
    import json

    from brisk.diagnose.report import write_report

    def rec(step, total):
        return {"step": step, "epoch": 0, "total": total, "data": 0.0, "compute": total, "forward": total / 3,
                "backward": total / 2, "optimizer": total / 6, "host": total, "events": {},
                "shape": {"layout": "packed", "rows": 1, "len": 256, "tokens": 200}, "new_shape": False}

    for name, scale in (("steps.jsonl", 1.0), ("steps.rank1.jsonl", 2.0)):
        (tmp_path / name).write_text("".join(json.dumps(rec(i, 0.1 * scale)) + "\n" for i in range(1, 6)))
    slow = {"step": 4, "total": 0.9, "median": 0.2, "ratio": 4.5, "cause": "data", "why": "waited"}
    (tmp_path / "slow_steps.rank1.jsonl").write_text(json.dumps(slow) + "\n")
    text = write_report(tmp_path).read_text()
    assert "| 0 | 5 | 100.0 ms" in text and "| 1 | 5 | 200.0 ms" in text
    assert "Job step (slowest rank each step, 5 steps): mean 200.0 ms" in text and "rank 1 on 5 steps" in text
    assert "| 4 (rank 1) | 0.900 s |" in text


# ----------------------------------------------------------------------------------- FSDP2 == DDP
def _torchrun(run_dir, **extra):
    import subprocess
    import sys

    from .conftest import DEMO_CONFIG, REPO, tiny_overrides

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "brisk", "train",
           str(DEMO_CONFIG), *tiny_overrides(run_dir, **extra)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


def test_fsdp_equals_ddp_and_saves_the_full_state_dict(tmp_path):
    """FSDP2 over 2 gloo ranks against DDP over 2 ranks, 3 steps, frozen encoder (left out of the sharding)."""
    import json

    from brisk.models.build import build_model

    from .conftest import tiny_config

    common = {**EQUAL, "model.encoder.freeze": True, "train.export": "funasr", "train.export_dtype": "fp32"}
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    _torchrun(ddp, **common)
    _torchrun(fsdp, **common, **{"train.parallel": "fsdp"})
    # speed.label_head runs the (tied) LM head outside the model's forward, on the root's gathered weight
    label = tmp_path / "fsdp_label_head"
    _torchrun(label, **{**common, "train.parallel": "fsdp", "speed.label_head": True, "train.export": "none",
                        "train.save_final": False})
    assert "FSDP2 over 2 ranks: 2 decoder layers + the root" in (fsdp / "train.log").read_text()
    for r in (0, 1):
        a = _read_probe(ddp / f"probe.rank{r}.jsonl")
        for other in (fsdp, label):
            b = _read_probe(other / f"probe.rank{r}.jsonl")
            for s in (1, 2, 3):
                assert abs(a[("loss", s)] - b[("loss", s)]) <= 1e-5 * a[("loss", s)], (other.name, r, s)
                assert abs(a[("grad_norm", s)] - b[("grad_norm", s)]) <= 1e-5 * a[("grad_norm", s)], (other.name, r, s)
    pa = read_checkpoint(ddp / "checkpoints" / "ckpt-00000003.pt")
    pb = read_checkpoint(fsdp / "checkpoints" / "ckpt-00000003.pt")
    single = build_model(tiny_config(tmp_path / "x", **common)).state_dict()
    assert list(pb["state_dict"]) == list(single) == list(pa["state_dict"])  # same keys, same order
    for k, v in pb["state_dict"].items():
        assert type(v) is torch.Tensor and v.shape == single[k].shape and v.dtype == single[k].dtype, k
    worst = max(float((pa["state_dict"][k] - pb["state_dict"][k]).abs().max()) for k in single)
    assert worst <= 1e-4, worst  # the same bound as 2 ranks vs 1 (Adam turns fp32 reordering into small updates)
    # The optimizer state in torch's own layout (numbered parameters), as DDP saves it.
    assert pb["optimizer"]["param_groups"][0]["params"] == pa["optimizer"]["param_groups"][0]["params"]
    assert pb["optimizer"]["state"].keys() == pa["optimizer"]["state"].keys()
    for i, st in pa["optimizer"]["state"].items():
        assert torch.allclose(st["exp_avg_sq"], pb["optimizer"]["state"][i]["exp_avg_sq"], rtol=1e-4, atol=1e-12), i
    exported = torch.load(fsdp / "model-funasr" / "model.pt", weights_only=False)["state_dict"]
    assert exported.keys() == single.keys()
    # A DDP checkpoint resumes under FSDP (each rank keeps its shard of the full state): step 4 continues.
    more = tmp_path / "more"
    _torchrun(more, **{**common, "train.max_steps": 4, "train.parallel": "fsdp",
                       "train.resume_from": str(ddp / "checkpoints" / "ckpt-00000003.pt")})
    assert [json.loads(x)["step"] for x in (more / "steps.jsonl").read_text().splitlines()] == [4]
    pc = read_checkpoint(more / "checkpoints" / "ckpt-00000004.pt")
    assert pc["optimizer"]["state"][0]["step"] == 4 and pc["state_dict"].keys() == single.keys()


def test_parallel_key_is_checked(tmp_path):
    from brisk.cli import main

    from .conftest import DEMO_CONFIG

    with pytest.raises(ConfigError, match=r"train.parallel='zero': use ddp or fsdp"):
        from .conftest import tiny_config

        tiny_config(tmp_path, **{"train.parallel": "zero"})
    assert main(["train", str(DEMO_CONFIG), "train.parallel=fsdp", "train.max_stepz=1"]) == 2


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_every_parallel_value_runs_or_is_refused_on_gloo_within_a_minute(tmp_path, parallel):
    """The demo config as a newcomer starts it under torchrun on the CPU (its validation decodes): ddp trains; fsdp
    is refused in one line (decoding on rank 0 alone would wait forever for FSDP's all-gathers), leaving nothing."""
    import subprocess
    import sys

    from .conftest import DEMO_CONFIG, REPO

    run = tmp_path / "x"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "brisk", "train",
           str(DEMO_CONFIG), f"train.parallel={parallel}", f"train.output_dir={run}", "train.max_steps=2",
           "train.val_decode=2", "train.progress=false", "data.num_workers=0", "train.export=none"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    if parallel == "ddp":
        assert out.returncode == 0, out.stderr[-3000:]
    else:
        errors = [x for x in out.stderr.splitlines() if x.startswith("error:")]
        assert out.returncode != 0 and errors and "train.val_decode with train.parallel=fsdp" in errors[0]
        assert not run.exists()


# ----------------------------------------------------------------------------- the run folder, two ranks
def _folder_worker(rank, world, init_file, run_dir):
    import time

    import brisk.train.run_dir as run_dirs
    from brisk.train.run import build_trainer

    from .conftest import tiny_config

    _init(rank, world, init_file)
    try:
        if rank == 0:  # rank 0 is slow to look at the folder: rank 1 must not have written to it by then
            prepare = run_dirs.prepare
            run_dirs.prepare = lambda cfg, *a: (time.sleep(2), prepare(cfg, *a))[1]
        trainer = build_trainer(tiny_config(run_dir, **{"train.max_steps": 1}))
        trainer.close_data()
        assert trainer.run_dir == Path(run_dir)
    finally:
        _close()


def test_other_ranks_wait_for_rank0_to_check_a_fresh_run_folder(tmp_path):
    """Seen on 2 H200s: rank 1 opened train.log first and rank 0 refused its own fresh folder."""
    _spawn(_folder_worker, tmp_path, str(tmp_path / "run"))
    assert (tmp_path / "run" / "train.log").exists()


def test_graphs_are_released_before_the_process_group_is_destroyed(tmp_path):
    """A CUDA graph holding a captured NCCL all-reduce makes destroy_process_group hang (pytorch#115388):
    close_process_group frees the step's graphs while the group still exists, then destroys it."""
    import torch.distributed as dist

    from brisk.distributed.sync import close_process_group

    seen = []

    class Step:
        def release(self):
            seen.append(dist.is_initialized())
            return 3

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    close_process_group(Step())
    assert seen == [True] and not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg2'}", rank=0, world_size=1)
    close_process_group(object())  # the eager step has nothing to release
    assert not dist.is_initialized()
