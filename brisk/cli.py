"""brisk: fast, trustworthy fine-tuning of speech-LLMs (Fun-ASR-Nano, Qwen3-ASR) and chat LLMs (Qwen3, Qwen3.5).

    brisk train [CONFIG] [key=value ...]       fine-tune (no CONFIG: the bundled demo on the CPU)
    brisk report RUN                           step-time plot, slow steps and causes, acceleration state
    brisk doctor                               GPU, torch, cuDNN, SDPA order, known traps for this machine
    brisk doctor --kernels CONFIG              the plan's kernels here, at CONFIG's shapes, against their references
    brisk probe compare A B [--tolerances F]   were the numbers kept? gates met or unmet
    brisk probe calibrate A B [C ...]          tolerances from the spread of equivalent runs
    brisk export RUN [--format funasr|hf]      a model folder FunASR or transformers loads (RUN: a run folder,
                                               or a FunASR / native folder to convert)
    brisk bench CONFIG [key=value ...]         arms interleaved on the same batches, a markdown table
    brisk profile CONFIG [key=value ...]       top ops on CPU and GPU, launches a step, host- or device-bound
    brisk eval RUN_OR_MODEL data.jsonl         decode, CER/WER (jiwer), one line per utterance, speed (a chat run:
                                               loss, perplexity, accuracy, exact match of greedy answers)
    brisk transcribe RUN_OR_MODEL a.wav ...    print the transcript of each file

    `brisk COMMAND --help` says more; `brisk train --help-config` lists every config key. A shipped config is
    named without a path (demo, sft_demo, qwen3_asr_demo, fun_asr_nano, ...). Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import signal
import sys
from pathlib import Path

from . import __version__

REPO = Path(__file__).resolve().parent.parent
DEMO = Path(__file__).resolve().parent / "configs" / "demo.yaml"  # shipped in the package (configs/ in the repo)
DEMO_DATA = Path(__file__).resolve().parent / "bundled" / "demo"  # shipped in the package (data/ in the repo)


def _config_and_overrides(items: list[str], default: Path | None) -> tuple[Path | None, list[str]]:
    """(config file, overrides): the first item is a config when it is not key=value; a path, or the name of a
    config shipped with brisk (``fun_asr_nano``: brisk/configs/fun_asr_nano.yaml) when no such file is here."""
    if items and "=" not in items[0]:
        from .config import ConfigError, _known_path, shipped_config

        first = items[0]
        # configs/NAME.yaml as the docs write it names the shipped config where there is no such file (pip install)
        named = shipped_config(Path(first).name) if Path(first).parts[:1] == ("configs",) else shipped_config(first)
        if not Path(first).exists() and named is not None:
            return named, items[1:]
        if not Path(first).exists() and not first.endswith((".yaml", ".yml")) and _known_path(first):
            raise ConfigError(f"{first} has no value: did you mean key=value, for example {first}=VALUE?")
        return Path(first), items[1:]
    return default, items


def _load(items: list[str], default: Path | None = None):
    from .config import ConfigError, load_config

    path, overrides = _config_and_overrides(items, default)
    if path is None:
        raise ConfigError("give a config: a file, or the name of a shipped one (for example fun_asr_nano)")
    if path == DEMO and not DEMO_DATA.exists():
        raise ConfigError(f"the demo's data {DEMO_DATA} is missing: reinstall brisk (it ships the demo sets)")
    return load_config(path, overrides)


def cmd_train(args) -> int:
    from .train.run import train

    if args.help_config:  # with a config: that config's values beside each key
        from .config.help import help_text

        path, overrides = _config_and_overrides(list(args.items), None)
        if path is None and not overrides:
            sys.stdout.write(help_text())
        else:
            from .config import load_config

            name = args.items[0] if path is not None else "the defaults with these overrides"
            sys.stdout.write(help_text(load_config(path, overrides, check_paths=False), name))
        return 0
    items = list(args.items)
    if _config_and_overrides(items, None)[0] is None and not any(i.split("=", 1)[0] == "train.output_dir" for i in items):
        # The demo with no config: a fresh folder under ./runs each time, so runs never mix.
        from .train.run_dir import demo_dir

        had_runs = (Path.cwd() / "runs").exists()
        folder = demo_dir()
        items.append(f"train.output_dir={folder}")
        try:
            cfg = _load(items, DEMO)
        except Exception:
            folder.rmdir()  # still empty: a mistake in the overrides leaves no folder behind
            if not had_runs:
                folder.parent.rmdir()  # nor the ./runs made for it
            raise
        print(f"run folder: {folder}", flush=True)
    else:
        cfg = _load(items, DEMO)
    from .bench.autobatch import sized_to_gpu

    result = train(sized_to_gpu(cfg))  # data.auto_batch (off by default: cfg unchanged)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    if result.get("stopped_by"):
        from .train.stop import resume_command

        print(f"stopped by {signal.Signals(result['stopped_by']).name} after step {result['step']}; checkpoint "
              f"{result['checkpoint']}; resume: {resume_command(items, cfg.train.output_dir)}", flush=True)
        return 128 + result["stopped_by"]
    hist = result["history"]
    if hist:
        first, last = hist[0], hist[-1]
        print(f"validation loss {first['loss']:.4f} (step {first['step']}) -> {last['loss']:.4f} (step {last['step']}), "
              f"accuracy {first['acc']:.3f} -> {last['acc']:.3f}")
        if "cer" in first and "cer" in last:
            from .eval.evaluate import print_transcripts

            print_transcripts(first, last, result["transcripts"])
    slow = result.get("slow_in_run", len(result["slow_steps"]))  # the whole run's (a resumed one too)
    print(f"{result['step']} steps, {slow} slow; run folder: {cfg.train.output_dir}")
    return 0


def cmd_report(args) -> int:
    from .diagnose.report import console_summary, write_report

    out = write_report(args.run)
    print(console_summary(out.read_text(encoding="utf-8")))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def cmd_doctor(args) -> int:
    if args.constraints:
        from .versions import CONSTRAINTS

        print(CONSTRAINTS)
        return 0
    if args.kernels:
        from .diagnose.kernel_doctor import kernel_doctor

        path, overrides = _config_and_overrides([args.kernels, *args.overrides], None)
        print(kernel_doctor(str(path), overrides))
        return 0
    from .diagnose.doctor import doctor

    print(doctor())
    return 0


def cmd_probe(args) -> int:
    from .config import ConfigError
    from .probe.compare import calibrate_main, compare_main

    try:
        return _probe(args, compare_main, calibrate_main)
    except ValueError as e:  # a record that is not one, records that cannot be compared: one line, exit 2
        raise ConfigError(str(e)) from None


def _probe(args, compare_main, calibrate_main) -> int:
    if args.action == "compare":
        if len(args.records) != 2:
            raise ValueError("probe compare takes two records (run folders or probe.rank0.jsonl files)")
        return compare_main(args.records[0], args.records[1], args.tolerances, args.out)
    if len(args.records) < 2:
        raise ValueError("probe calibrate takes two or more records of equivalent runs")
    return calibrate_main(args.records, args.out, args.margin, args.allow_config_diff)


def default_export_format(src: Path) -> str:
    """A run's own train.export format when its family writes it, else one the family writes (a chat or
    Qwen3-ASR run: hf); funasr for a folder to convert."""
    import yaml

    from .families import DEFAULT, get
    from .formats.run_folder import folder_kind

    if folder_kind(src) != "run":
        return "funasr"
    raw = yaml.safe_load((src / "config.yaml").read_text(encoding="utf-8"))
    family = get((raw.get("model") or {}).get("family") or DEFAULT)
    own = (raw.get("train") or {}).get("export")
    return own if own in family.exporters else "funasr" if "funasr" in family.exporters else next(iter(family.exporters))


def cmd_export(args) -> int:
    from .eval.load import load_for_inference
    from .formats.run_folder import folder_kind
    from .models.export import export_folder

    src = Path(args.run)
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a folder (give a run folder, a FunASR or a native Fun-ASR-Nano folder)")
    args.format = args.format or default_export_format(src)
    default = src / f"model-{args.format}" if folder_kind(src) == "run" else src.parent / f"{src.name}-{args.format}"
    out = Path(args.out) if args.out else default
    replaced = out.exists()
    # The run's own export of this format (the one training ended with) is rewritten from the run's weights;
    # any other existing folder is replaced only on request.
    own = args.out is None and folder_kind(src) == "run"
    if replaced and not (args.overwrite or own):
        from .config import ConfigError

        raise ConfigError(f"{out} already exists: pass --overwrite to replace it, or --out for another folder")
    model, tokenizer, cfg = load_for_inference(src)
    out = export_folder(model, cfg, out, args.format, args.dtype, tokenizer)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"exported {args.format} folder {out} ({args.dtype}, {size / 1e6:.1f} MB)" + (", replacing the one there" if replaced else ""))
    return 0


def cmd_bench(args) -> int:
    from .bench.bench import run_bench
    from .train.run import setup_logging

    cfg = _load(args.items)
    _, given = _config_and_overrides(args.items, None)
    setup_logging(None)  # a line as each run of each arm finishes: a long bench is not silent until its table
    run_bench(cfg, Path(args.out) if args.out else None, given)
    return 0


def cmd_profile(args) -> int:
    from .bench.profile import run_profile

    cfg = _load(args.items)
    run_profile(cfg, steps=args.steps, warmup=args.warmup, out=Path(args.out) if args.out else None)
    return 0


def option_hint(argv: list[str], unknown: list[str]) -> str | None:
    """For `brisk train --device cuda` and the like: settings are key=value, not options. The config keys that end
    in the option's name, as one line, or None when the option names none."""
    from .config import leaf_keys

    for i, arg in enumerate(argv):
        if arg in unknown and arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg[2:].partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                value = argv[i + 1]
            keys = [k for k in leaf_keys() if k.rsplit(".", 1)[-1] == name.replace("-", "_")]
            if keys:
                return (f"{arg} is not an option: config settings are key=value after the config, e.g. "
                        f"{keys[0]}={value or '...'}" + (f" (keys of that name: {', '.join(keys)})" if len(keys) > 1 else ""))
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and isinstance(getattr(args, "items", None), list) and all("=" in u and not u.startswith("-") for u in unknown):
        args.items = args.items + unknown  # key=value settings after an option (`brisk profile demo --steps 5 k=v`)
        unknown = []
    if unknown:
        hint = option_hint(argv, unknown) if args.cmd in ("train", "bench", "profile") else None
        if hint is None:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        print(f"error: {hint}", file=sys.stderr)  # one line, as every other mistake
        return 2
    from .config import ConfigError
    from .data.audio import AudioError
    from .data.jsonl import DataError

    try:
        from .families import load_module

        for module in args.family_module:
            load_module(module)
        return args.fn(args)
    except (ConfigError, DataError, AudioError, FileNotFoundError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the system refused (permissions, a folder where a file goes): name it
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # a write past the disk's end: often no file name to give
            where = f"{e.filename}: " if e.filename else ""
            print(f"error: {where}the disk is full ({e.strerror}): free space on it (or point train.output_dir at a "
                  "larger disk); the checkpoints already written are whole, and train.resume=true continues from "
                  "the last one", file=sys.stderr)
            return 2
        if not e.filename:
            raise
        print(f"error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """The brisk command's arguments (tests parse every documented command with it)."""
    p = argparse.ArgumentParser(prog="brisk", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"brisk {__version__}")
    p.add_argument("--family-module", action="append", default=[], metavar="MODULE",
                   help="import MODULE (a dotted name or a .py file) first: a model family of your own registers "
                        "itself there (brisk.families.register); installed packages can use the brisk.families "
                        "entry point group instead")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="fine-tune; with no config, the bundled demo on the CPU")
    t.add_argument("items", nargs="*", help="[CONFIG] [key=value ...]: CONFIG is a YAML file or a shipped config's "
                                            "name (demo, sft_demo, qwen3_asr_demo, fun_asr_nano, ...); none: the "
                                            "speech demo in a fresh runs/demo-<date>-<time>")
    t.add_argument("--help-config", action="store_true", help="list every config key: type, default, meaning")
    t.set_defaults(fn=cmd_train)

    r = sub.add_parser("report", help="step-time report of a run folder")
    r.add_argument("run", help="a run folder: (re)writes its report.md and report.png and prints the tables")
    r.set_defaults(fn=cmd_report)

    d = sub.add_parser("doctor", help="check this machine for known traps")
    d.add_argument("--kernels", metavar="CONFIG", help="run each kernel CONFIG's speed plan would use here, at its "
                   "shapes: checked against its reference, timed against the path it replaces")
    d.add_argument("--constraints", action="store_true", help="print the path of the pip constraints file of the "
                   "last releases brisk was tested on (pip install -c PATH)")
    d.add_argument("overrides", nargs="*", help="key=value overrides of CONFIG")
    d.set_defaults(fn=cmd_doctor)

    pr = sub.add_parser("probe", help="compare or calibrate probe records")
    pr.add_argument("action", choices=["compare", "calibrate"],
                    help="compare: B against A, gate by gate (exit 1 if one is unmet); calibrate: tolerances from "
                         "the spread of equivalent runs")
    pr.add_argument("records", nargs="+", help="run folders trained with probe.enabled=true (or probe.rank<r>.jsonl "
                                               "files): compare takes A B, calibrate two or more")
    pr.add_argument("--tolerances", help="tolerance YAML, or a shipped name: default (brisk/probe/tolerances.yaml, the "
                    "declared gates) or kernel_noise (calibrated from two H200 runs differing in the attention kernel)")
    pr.add_argument("--out", help="compare: write the markdown table here; calibrate: write the proposed tolerances here")
    pr.add_argument("--margin", type=float, default=2.0, help="calibrate: tolerance = margin x the largest observed spread")
    pr.add_argument("--allow-config-diff", action="store_true",
                    help="calibrate: go on (with a warning) when the records' configs differ in keys that change numbers")
    pr.set_defaults(fn=cmd_probe)

    e = sub.add_parser("export", help="write a FunASR or transformers-native model folder")
    e.add_argument("run", help="a run folder (or a FunASR / native Fun-ASR-Nano folder to convert)")
    e.add_argument("--format", default=None,
                   help="funasr: model.pt + config.yaml for funasr.AutoModel (Fun-ASR-Nano); hf: transformers' layout "
                        "(default: a run's own train.export format, else one its model family writes; funasr for a "
                        "folder to convert)")
    e.add_argument("--out", help="output folder (default: RUN/model-FORMAT, replacing the run's own export of that format)")
    e.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="weights dtype (FunASR stores bf16)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    e.set_defaults(fn=cmd_export)

    b = sub.add_parser("bench", help="interleaved A/B arms on the same batches")
    b.add_argument("items", nargs="+", help="CONFIG [key=value ...]: a YAML file with bench.arms, or a shipped "
                                            "config's name (bench_demo: CPU-sized)")
    b.add_argument("--out", help="folder for the table and per-run files (default: <train.output_dir>/bench)")
    b.set_defaults(fn=cmd_bench)

    f = sub.add_parser("profile", help="torch.profiler op tables of a few steady steps")
    f.add_argument("items", nargs="+", help="CONFIG [key=value ...]: a YAML file or a shipped config's name")
    f.add_argument("--steps", type=int, default=3, help="steps profiled (default 3)")
    f.add_argument("--warmup", type=int, default=5, help="steps run first, not profiled (shape plans, compile; "
                                                         "default 5)")
    f.add_argument("--out", help="folder for tables and the trace (default: <train.output_dir>/profile)")
    f.set_defaults(fn=cmd_profile)

    from .data import speech_list, synthetic_chat

    dp = sub.add_parser("data", help="make training data: a FunASR jsonl from Kaldi lists, or synthetic chat sets")
    kinds = dp.add_subparsers(dest="data_kind", required=True)
    sp = kinds.add_parser("speech", help="wav.scp + text -> a FunASR jsonl (Fun-ASR-Nano, Qwen3-ASR)")
    speech_list.add_arguments(sp)
    sp.set_defaults(fn=speech_list.make)
    cp = kinds.add_parser("chat", help="the bundled chat demo set, or an ultrachat-like synthetic set, with a tokenizer")
    synthetic_chat.add_arguments(cp)
    cp.set_defaults(fn=synthetic_chat.make)

    from .eval.evaluate import add_verbs

    add_verbs(sub)  # eval, transcribe
    return p


def one_line(e: BaseException) -> str:
    """The message an error carries, without the traceback a DataLoader worker wraps around it."""
    text = str(e)
    if "Original Traceback" in text:  # torch's ExceptionWrapper: "Caught X in DataLoader worker ...\n<traceback>"
        last = [x for x in text.splitlines() if x.strip()][-1]
        text = re.sub(r"^[\w.]+(Error|Exception): ", "", last)
    return text


def _stdout_closed() -> bool:
    """Is standard output a pipe whose reader has gone (poll reports an error on its write end)?"""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR)
        return bool(poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll here, or stdout without a file descriptor
        return False


def run() -> None:
    """The program's entry (the `brisk` command and `python -m brisk`): main(), then a prompt exit.

    By the last line everything the command wrote is closed (logs, TensorBoard, checkpoint writer, data
    workers, export); what is left is interpreter teardown (Inductor's compile workers, CUDA graph pools),
    which took ~5 s after a compiled, graphed run on an H200. Tests call main() and keep their interpreter."""
    try:
        rc = main()
        sys.stdout.flush()  # here, so that a closed pipe found by the last write is handled below
    except SystemExit as e:  # argparse's --help/--version and usage errors
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:  # Ctrl-C outside training (training stops itself: brisk.train.stop)
        print("interrupted", file=sys.stderr)
        rc = 130
    except BrokenPipeError:
        if not _stdout_closed():  # another pipe (a worker's, a subprocess's): an error like any other
            import traceback

            traceback.print_exc()
            rc = 1
        else:  # `brisk ... | head`: the reader stopped; what is left to print goes nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            print("brisk: the output pipe was closed by its reader; the rest of the output is dropped",
                  file=sys.stderr)
            rc = 141  # as a shell reports a program stopped by SIGPIPE
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    run()
