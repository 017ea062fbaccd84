"""`brisk bench CONFIG`: arms run interleaved on the same batches, a markdown table at the end.

Each arm is the config plus its own overrides (bench.arms); the command line's speed keys stay under an arm's
preset. Runs go A B C A B C ... (bench.runs per arm),
each from a fresh model with the same seed, training on the same batch stream: ``bench.warmup`` steps,
then ``bench.steps`` timed steps run as the trainer runs them (pinned batches, no sync inside a step; the
device is synchronised at the two ends of the timed region). Per run: mean step time (region wall / steps),
median and steps over 3x the median (per-step CUDA-event spans), phase medians (CUDA events),
first-step time, the wall time of the whole training phase, peak allocated memory. For the first run of
each arm also: kernel launches a step (torch.profiler over bench.profile_steps steps) and, for the first
arm, the model FLOPs a step, which give each arm's fraction of the measured matmul rate (the roofline).

An arm whose overrides change the data section (``data.batch_tokens``: a batch-size sweep) trains on its own
stream: the same utterances in the same order, cut into its own batches (``data.max_utts`` scaled with the
budget unless the arm sets it, as data.auto_batch does). Arms then carry different tokens a step, so the table
compares real LLM tokens a second; the roofline is given only for arms on the first arm's stream (its FLOPs).
The table is rewritten after every run, so a run cut short by a time limit keeps what finished.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
import torch._dynamo

from ..config import Config, _merge, _set_dotted, build_config, parse_override
from ..plan import check_rules, expand_preset
from ..diagnose.timer import StepTimer
from ..distributed.ranks import pick_device
from .harness import build_runner, count_flops, flops_str, llm_vocab, matmul_rate, sample_stream, sync

log = logging.getLogger("brisk")


def launches(runner, batches) -> dict:
    """Host launch calls and device kernels a step, from torch.profiler over ``batches``."""
    from torch.profiler import ProfilerActivity, profile

    from .profile import launch_counts
    from .quiet import without_profiler_chatter

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.device.type == "cuda" else [])
    with without_profiler_chatter(), profile(activities=acts) as prof:
        for b in batches:
            runner.run(b)
        sync(runner.device)
    return launch_counts(prof.events(), len(batches))


def one_run(cfg: Config, stream: list, warmup: int, steps: int) -> tuple[dict, object]:
    """One run: warm-up steps, then timed steps as the trainer runs them (no sync inside a step).

    The mean is the timed region's wall time over its steps (one sync at each end), so host work that
    overlaps the device is not counted twice; per-step times (median, slow steps, phases) are the CUDA-event
    spans of each step, and per-step host walls are kept too.
    """
    timer = StepTimer(pick_device(cfg.train.device), lag=10**9)
    runner = build_runner(cfg, mark=timer.mark)
    batches = runner.batches(stream)
    dev = runner.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    walls, recs = [], []
    phase_t0 = time.perf_counter()
    first = None
    for i, b in enumerate(batches[: warmup + steps]):
        if i == warmup:
            sync(dev)
            region_t0 = time.perf_counter()
        t0 = time.perf_counter()
        timer.start(i + 1, 0, b, 0.0, {})
        runner.run(b)
        recs += timer.end({})
        if i == 0:
            sync(dev)
            first = time.perf_counter() - t0
        walls.append(time.perf_counter() - t0)
    sync(dev)
    region = time.perf_counter() - region_t0
    phase = time.perf_counter() - phase_t0
    recs += timer.flush()
    tr = recs[warmup:]
    per_step = [r["total"] for r in tr]
    med = statistics.median(per_step)
    out = {
        "mean": region / steps, "median": med, "slow": sum(1 for t in per_step if t > 3 * med),
        "forward": statistics.median(r["forward"] for r in tr), "backward": statistics.median(r["backward"] for r in tr),
        "optimizer": statistics.median(r["optimizer"] for r in tr), "first_step": first, "setup": runner.setup_seconds,
        "phase_wall": phase, "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0.0,
        "steps": per_step, "host_walls": walls,
        # what a timed step carried: real LLM tokens, labelled ones, and positions computed (rows x length)
        "tokens": statistics.fmean(r["shape"]["tokens"] for r in tr),
        "label_tokens": statistics.fmean(r["shape"]["label_tokens"] for r in tr),
        "positions": statistics.fmean(r["shape"]["rows"] * r["shape"]["len"] for r in tr),
    }
    return out, (runner, batches)


def arm_configs(cfg: Config, given: list[str] = ()) -> list[Config]:
    """Each arm's config. ``given``: the command line's key=value overrides, already in the base; their speed keys
    keep the base's value under an arm's speed.preset (which would write its own, such as pack_buckets, over
    them), unless the arm sets the key itself."""
    keep = [key.split(".", 1)[1] for key, _ in map(parse_override, given) if key.startswith("speed.")]
    return [with_overrides(cfg, arm.overrides, keep) for arm in cfg.bench.arms]


def run_bench(cfg: Config, out_dir: Path | None = None, given: list[str] = ()) -> str:
    b = cfg.bench
    if not b.arms:
        raise ValueError("bench.arms is empty: list the arms (name + overrides) in the config")
    out_dir = out_dir or Path(cfg.train.output_dir) / "bench"
    n = b.batches or (b.warmup + b.steps + b.profile_steps)
    configs = arm_configs(cfg, given)
    streams = arm_streams(cfg, configs, n)
    results: dict[str, list[dict]] = {arm.name: [] for arm in b.arms}
    extra: dict[str, dict] = {}
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.train.device != "cpu" else "cpu")
    rate, rate_what = matmul_rate(device)
    own = {arm.name for arm, s in zip(b.arms, streams) if s is not streams[0]}  # arms off the first arm's stream

    def write(flops: float | None) -> str:
        table = render(results, extra, flops or 0.0, rate, rate_what, b, gpu=device.type == "cuda", own_stream=own)
        out_dir.mkdir(parents=True, exist_ok=True)  # made at the first write: a refused bench leaves no folder
        (out_dir / "bench.md").write_text(table, encoding="utf-8")
        (out_dir / "bench.json").write_text(json.dumps({"results": results, "extra": extra, "flops": flops, "rate": rate,
                                                        "arms": [asdict(a) for a in b.arms]}, indent=1), encoding="utf-8")
        return table

    with dynamo_limits(64):
        flops = _runs(b, configs, streams, results, extra, write)
    table = write(flops)
    print(table)
    print(f"wrote {out_dir / 'bench.md'} and {out_dir / 'bench.json'}")
    return table


@contextmanager
def dynamo_limits(limit: int):
    """Every compiled run in a bench builds a new model; Dynamo's per-function recompile limit (8) would
    send later runs silently to eager. Raised for the bench, restored after."""
    import torch._dynamo.config as dc

    saved = dc.recompile_limit
    dc.recompile_limit = max(saved, limit)
    try:
        yield
    finally:
        dc.recompile_limit = saved


def arm_streams(cfg: Config, configs: list[Config], n: int) -> list[list]:
    """Each arm's batch stream: the base config's, unless the arm changes the data section; arms with the same
    data section share one stream (the same object)."""
    made: dict[str, list] = {}

    def stream(c: Config) -> list:
        key = json.dumps(asdict(c.data), sort_keys=True, default=str)
        if key not in made:
            made[key] = sample_stream(c, n, llm_vocab(c))
        return made[key]

    base = stream(cfg)
    return [base if acfg.data == cfg.data else stream(acfg) for acfg in configs]


def _runs(b, configs, streams, results, extra, write) -> float | None:
    flops = None
    for rep in range(b.runs):
        for arm, acfg, stream in zip(b.arms, configs, streams):
            log.info("bench: run %d of arm %s", rep + 1, arm.name)
            res, (runner, batches) = one_run(acfg, stream, b.warmup, b.steps)
            if rep == 0:
                tail = batches[b.warmup + b.steps:][: b.profile_steps] or batches[-b.profile_steps:]
                extra[arm.name] = launches(runner, tail)
                if flops is None:  # the first arm's stream: the roofline's FLOPs
                    flops = count_flops(runner, batches[b.warmup: b.warmup + b.steps])
            results[arm.name].append(res)
            log.info("bench: %s run %d: mean %.1f ms, median %.1f ms, %.0f LLM tokens a step, %.0f tokens/s", arm.name,
                     rep + 1, res["mean"] * 1e3, res["median"] * 1e3, res["tokens"], res["tokens"] / res["mean"])
            write(flops)
            del runner, batches
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            # Each run compiles afresh, as its own `brisk train` process would: on the H200 the later compiled arms
            # of a process ran without their compiled code. Unverified as the fix.
            torch._dynamo.reset()
    return flops


def with_overrides(cfg: Config, overrides: list[str], keep: list[str] = ()) -> Config:
    """The base config with an arm's key=value overrides on top (checked like any override). An arm's
    speed.preset wins over the base config's switches, except the speed keys in ``keep``; the arm's own speed keys
    win over its preset."""
    patch: dict = {}
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(patch, key, value)
    tree = _merge(cfg.to_dict(), patch)
    data = patch.get("data") or {}
    if "batch_tokens" in data and "max_utts" not in data:  # the same utterance density, as data.auto_batch scales it
        tree["data"]["max_utts"] = max(1, math.ceil(cfg.data.max_utts * data["batch_tokens"] / cfg.data.batch_tokens))
    if (patch.get("speed") or {}).get("preset"):
        kept = {k: tree["speed"][k] for k in keep if k in tree["speed"]}
        tree = _merge(tree, expand_preset({"model": tree["model"], "speed": {**kept, **patch["speed"]}}))
    out = build_config(tree)
    check_rules(out)
    return out




def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def render(results: dict, extra: dict, flops: float, rate: float, rate_what: str, b, gpu: bool = True,
           own_stream: set[str] = frozenset()) -> str:
    """The markdown table; without a GPU the GPU-only columns (launches, peak memory) are left out, not zeros.
    ``own_stream``: arms on batches of their own (a batch-size sweep): no roofline (the FLOPs are the first
    arm's), compared by tokens a second. Arms with no finished run yet are left out."""
    names = [n for n in results if results[n]]
    if not names:
        return "no run finished\n"
    tps = {n: statistics.fmean(r["tokens"] for r in results[n]) / statistics.fmean(r["mean"] for r in results[n])
           for n in names}
    same = "same batches" if not own_stream else "same utterances (arms marked * cut them into batches of their own)"
    lines = [
        f"Arms interleaved, {b.runs} runs each, {b.steps} timed steps after {b.warmup} warm-up steps, {same}. "
        f"Roofline: {flops_str(flops)} a step (counted) against {flops_str(rate)}/s ({rate_what}, measured).",
        "",
        "| arm | mean ms (runs) | median ms (runs) | steps >3x median | fwd / bwd / opt median ms "
        + ("| launches / kernels a step | peak GiB " if gpu else "")
        + "| LLM tokens a step | tokens/s | setup s | first step s | phase wall s | roofline | vs first (tokens/s) |",
        "|---" * (14 if gpu else 12) + "|",
    ]
    for name in names:
        rs = results[name]
        mean = statistics.fmean(r["mean"] for r in rs)
        e = extra.get(name, {})
        roof = f"{flops / mean / rate * 100:.1f}%" if rate and mean and name not in own_stream else "-"
        lines.append(
            f"| {name}{' *' if name in own_stream else ''} | {_ms(mean)} ({', '.join(_ms(r['mean']) for r in rs)}) "
            f"| {_ms(statistics.fmean(r['median'] for r in rs))} ({', '.join(_ms(r['median']) for r in rs)}) "
            f"| {', '.join(str(r['slow']) for r in rs)} "
            f"| {_phases(rs[0])} "
            + (f"| {e.get('launches', 0):.0f} / {e.get('kernels', 0):.0f} | {max(r['peak_gb'] for r in rs):.2f} " if gpu else "")
            + f"| {rs[0]['tokens']:.0f} | {tps[name]:,.0f} "
            f"| {_join(rs, 'setup', 1)} "
            f"| {_join(rs, 'first_step', 2)} | {_join(rs, 'phase_wall', 1)} "
            f"| {roof} | {tps[name] / tps[names[0]]:.2f}x |")
    spread = [f"{n}: {(_spread(results[n])):.1f}%" for n in names]
    first = results[names[0]][0]
    lines += ["", f"{names[0]}: a timed step carries {first['tokens']:.0f} real LLM tokens, {first['label_tokens']:.0f} "
              "of them labelled (mean); positions computed a step (rows x length, padding included): "
              + ", ".join(f"{n}: {results[n][0]['positions']:.0f}" for n in names)]
    if own_stream:
        lines += ["", "* batches of its own (data.batch_tokens): an epoch is the same tokens in fewer, larger steps; "
                  "the same learning-rate schedule per token: optim.warmup_step_tokens (warmup_steps scaled to the batch)."]
    lines += ["", "Run-to-run spread of the mean (max-min over mean): " + ", ".join(spread)]
    return "\n".join(lines) + "\n"


def _phases(r: dict) -> str:
    """Median forward / backward / optimizer; a graphed step is one replay with no marks inside: its whole span."""
    if r["forward"] == 0.0 and r["backward"] == 0.0:
        return f"whole graphed step {_ms(r['optimizer'])}"
    return f"{_ms(r['forward'])} / {_ms(r['backward'])} / {_ms(r['optimizer'])}"


def _join(rs: list[dict], key: str, digits: int) -> str:
    return ", ".join(f"{r[key]:.{digits}f}" for r in rs)


def _spread(rs: list[dict]) -> float:
    means = [r["mean"] for r in rs]
    return (max(means) - min(means)) / statistics.fmean(means) * 100 if len(means) > 1 else 0.0
