"""The ``brisk`` command.

    brisk train [CONFIG] [key=value ...]       fine-tune (no CONFIG: the bundled demo on the CPU)
    brisk report RUN                           step-time plot, slow steps and causes, acceleration state
    brisk doctor                               GPU, torch, cuDNN, SDPA order, known traps for this machine
    brisk probe compare A B [--tolerances F]   were the numbers kept? gates met or unmet
    brisk probe calibrate A B [C ...]          tolerances from the spread of equivalent runs
    brisk bench CONFIG [key=value ...]         arms interleaved on the same batches, a markdown table
    brisk profile CONFIG [key=value ...]       top ops on CPU and GPU, launches a step, host- or device-bound
    brisk eval RUN_OR_MODEL data.jsonl         decode, CER/WER (jiwer), one line per utterance, speed
    brisk transcribe RUN_OR_MODEL a.wav ...    print the transcript of each file
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo.yaml"


def _config_and_overrides(items: list[str], default: Path | None) -> tuple[Path | None, list[str]]:
    if items and "=" not in items[0]:
        return Path(items[0]), items[1:]
    return default, items


def _load(items: list[str], default: Path | None = None):
    from .config import load_config

    path, overrides = _config_and_overrides(items, default)
    if path is None:
        raise SystemExit("error: give a config file (for example configs/fun_asr_nano.yaml)")
    if path == DEMO and not DEMO.exists():
        raise SystemExit(f"error: the demo config {DEMO} is missing; run from a checkout of brisk (pip install -e .)")
    return load_config(path, overrides)


def cmd_train(args) -> int:
    from .train.run import train

    cfg = _load(args.items, DEMO)
    result = train(cfg)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    hist = result["history"]
    if hist:
        first, last = hist[0], hist[-1]
        print(f"validation loss {first['loss']:.4f} (step {first['step']}) -> {last['loss']:.4f} (step {last['step']}), "
              f"accuracy {first['acc']:.3f} -> {last['acc']:.3f}")
        if "cer" in first and "cer" in last:
            from .eval.evaluate import print_transcripts

            print_transcripts(first, last, result["transcripts"])
    print(f"{result['step']} steps, {len(result['slow_steps'])} slow; run folder: {cfg.train.output_dir}")
    return 0


def cmd_report(args) -> int:
    from .diagnose.report import write_report

    print(write_report(args.run))
    return 0


def cmd_doctor(args) -> int:
    from .diagnose.doctor import doctor

    print(doctor())
    return 0


def cmd_probe(args) -> int:
    from .probe.compare import calibrate_main, compare_main

    if args.action == "compare":
        if len(args.records) != 2:
            raise SystemExit("error: probe compare takes two records (run folders or probe.rank0.jsonl files)")
        return compare_main(args.records[0], args.records[1], args.tolerances, args.out)
    if len(args.records) < 2:
        raise SystemExit("error: probe calibrate takes two or more records of equivalent runs")
    return calibrate_main(args.records, args.out, args.margin)


def cmd_bench(args) -> int:
    from .bench.bench import run_bench

    cfg = _load(args.items)
    run_bench(cfg, Path(args.out) if args.out else None)
    return 0


def cmd_profile(args) -> int:
    from .bench.profile import run_profile

    cfg = _load(args.items)
    run_profile(cfg, steps=args.steps, warmup=args.warmup, out=Path(args.out) if args.out else None)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="brisk", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="fine-tune; with no config, the bundled demo on the CPU")
    t.add_argument("items", nargs="*", help="[CONFIG.yaml] [key=value ...]")
    t.set_defaults(fn=cmd_train)

    r = sub.add_parser("report", help="step-time report of a run folder")
    r.add_argument("run")
    r.set_defaults(fn=cmd_report)

    d = sub.add_parser("doctor", help="check this machine for known traps")
    d.set_defaults(fn=cmd_doctor)

    pr = sub.add_parser("probe", help="compare or calibrate probe records")
    pr.add_argument("action", choices=["compare", "calibrate"])
    pr.add_argument("records", nargs="+")
    pr.add_argument("--tolerances", help="tolerance YAML (default: the shipped brisk/probe/tolerances.yaml)")
    pr.add_argument("--out", help="compare: write the markdown table here; calibrate: write the proposed tolerances here")
    pr.add_argument("--margin", type=float, default=2.0, help="calibrate: tolerance = margin x the largest observed spread")
    pr.set_defaults(fn=cmd_probe)

    b = sub.add_parser("bench", help="interleaved A/B arms on the same batches")
    b.add_argument("items", nargs="+", help="CONFIG.yaml [key=value ...]")
    b.add_argument("--out", help="folder for the table and per-run files (default: <train.output_dir>/bench)")
    b.set_defaults(fn=cmd_bench)

    f = sub.add_parser("profile", help="torch.profiler op tables of a few steady steps")
    f.add_argument("items", nargs="+", help="CONFIG.yaml [key=value ...]")
    f.add_argument("--steps", type=int, default=3)
    f.add_argument("--warmup", type=int, default=5)
    f.add_argument("--out", help="folder for tables and the trace (default: <train.output_dir>/profile)")
    f.set_defaults(fn=cmd_profile)

    from .eval.evaluate import add_verbs

    add_verbs(sub)  # eval, transcribe

    args = p.parse_args(argv)
    from .config import ConfigError
    from .data.audio import AudioError
    from .data.jsonl import DataError

    try:
        return args.fn(args)
    except (ConfigError, DataError, AudioError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
