"""`brisk eval` and `brisk transcribe`: load a model, decode, score.

``load_run`` reads a brisk run folder (its config.yaml and its newest weights, or a chosen checkpoint), a
FunASR model folder or a native HF folder, through brisk.eval.load.load_for_inference.
Scoring: see brisk/eval/metrics.py for the normalisation; each line of the jsonl decodes its first audio
reference against its first assistant answer.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml

from ..config import Config, ConfigError
from ..errors import DataError
from ..families import family_of
from .decode import Recognizer
from .decode_step import COMPILE_MODES
from .metrics import corpus_rates, errors

log = logging.getLogger("brisk")


def load_run(path: str | Path, weights: str | None = None, device: str = "cpu"):
    """A run folder, a FunASR model folder or a native HF folder -> (config, model in eval mode on ``device``,
    tokenizer, the weights file of a run folder or None). ``weights``: a file, "best" or "last" (a run's
    checkpoints); by default a run's newest weights."""
    from ..formats.run_folder import folder_kind, run_weights
    from .load import load_for_inference

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (give a brisk run folder or a model folder)")
    w = None
    if folder_kind(path) == "run":
        raw = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
        w = run_weights(path, weights, (raw.get("train") or {}).get("keep_metric", "loss"))
        model, tokenizer, cfg = load_for_inference(path, device, weights=str(w))
    else:
        model, tokenizer, cfg = load_for_inference(path, device)
        if weights:
            from ..models.build import load_weights

            load_weights(model, Path(weights))
            w = Path(weights)
    # Nothing here trains: weights that need no gradient let the fast decoder skip copying its concatenated
    # weights again before every batch (brisk.eval.decode_step.FusedStep.refresh, which must while they train).
    model.requires_grad_(False)
    return cfg, model, tokenizer, w


@contextmanager
def frozen_gc(on: bool):
    """With a fast decoder (``on``), the decode of `brisk eval` / `brisk transcribe`: every object alive when it
    starts (torch, transformers, the model) is left out of Python's collections until it ends (``gc.freeze``), so
    a full collection, which would walk them all and land on an arbitrary batch, stays short; the batches' own
    garbage is still collected. Undone after, for in-process callers; a caller that froze objects itself is left
    as it is (gc.unfreeze would thaw its objects too)."""
    if not on or gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    log.info("decoding: %d objects left out of Python's garbage collections while decoding", gc.get_freeze_count())
    try:
        yield
    finally:
        gc.unfreeze()


def recognizer(cfg: Config, model, tokenizer, device: str = "cpu", **kw) -> Recognizer:
    """The model family's decoding (its prompt, features and splicing) with ``model``."""
    make = family_of(cfg).recognizer
    if make is None:
        raise ConfigError(f"model.family={cfg.model.family} does not decode audio (brisk eval gives its own measures)")
    return make(cfg, model, tokenizer, device, **kw)


def score(keys: list[str], refs: list[str], hyps: list[str]) -> tuple[list[dict], dict]:
    """Per-utterance rows (key, ref, hyp, errors; ``empty_ref`` where the reference is empty after
    normalisation) and the corpus summary: the per-utterance edits summed over the reference lengths
    (brisk.eval.metrics.corpus_rates)."""
    rows = []
    for k, r, h in zip(keys, refs, hyps):
        e = errors(r, h)
        rows.append({"key": k, "ref": r, "hyp": h, "char_errors": e.char_errors, "chars": e.chars,
                     "word_errors": e.word_errors, "words": e.words, **({"empty_ref": True} if e.chars == 0 else {})})
    summary = {"utterances": len(rows), **corpus_rates(refs, hyps),
               "char_errors": sum(r["char_errors"] for r in rows), "chars": sum(r["chars"] for r in rows),
               "word_errors": sum(r["word_errors"] for r in rows), "words": sum(r["words"] for r in rows)}
    return rows, summary


def summarize(rows: list[dict]) -> dict:
    """The corpus summary of scored rows (brisk.eval.evaluate.score's, in input order)."""
    return score([r["key"] for r in rows], [r["ref"] for r in rows], [r["hyp"] for r in rows])[1]


def evaluate(rec: Recognizer, items: list, out: Path | None, batch_size: int = 8, max_new_tokens: int | None = None,
             resume: bool = False, max_utts: int | None = None, progress: bool = False,
             threads: int = 0) -> tuple[list[dict], dict]:
    """Decode and score ``items`` (brisk.eval.testset.Item with references), streamed to ``out``, with
    ``threads`` torch CPU threads (brisk.eval.testset.run_items, host_threads). The summary covers every row in
    ``out`` (earlier runs' too, with ``resume``); its speed figures this run's decoding."""
    from .testset import run_items

    def row_of(item, result):
        return score([item.key], [item.ref], [result.text])[0][0]

    rows, t = run_items(rec, items, out, row_of, batch_size, max_new_tokens, resume, max_utts, progress, threads)
    summary = summarize(rows)
    seconds, audio = t["seconds"], t["audio_seconds"]
    summary.update(seconds=seconds, audio_seconds=audio, utts_per_s=t["decoded"] / max(seconds, 1e-9),
                   rtf=seconds / max(audio, 1e-9), device=str(rec.device), batch_size=batch_size,
                   decoder=decoder_name(rec), decoded_now=t["decoded"], inputs=len(items))
    return rows, summary


def decoder_name(rec: Recognizer) -> str:
    extra = ([f"step compiled, {rec.fast_compile}"] * bool(rec.fast_compile) + ["length buckets"] * rec.fast_buckets
             + ["several tokens a replay"] * rec.fast_multi_step)
    enc = f", encoder {str(rec.encoder_dtype).replace('torch.', '')}" if rec.encoder_dtype is not None else ""
    if not rec.fast:
        return "generate" + enc
    return "fast decoder" + (f" ({', '.join(extra)})" if extra else "") + enc


def summary_table(s: dict) -> str:
    return "\n".join([
        "| utterances | CER | WER | char errors / chars | word errors / words | utts/s | RTF | device |",
        "|---|---|---|---|---|---|---|---|",
        f"| {s['utterances']} | {100 * s['cer']:.2f}% | {100 * s['wer']:.2f}% | {s['char_errors']} / {s['chars']} | "
        f"{s['word_errors']} / {s['words']} | {s['utts_per_s']:.2f} | {s['rtf']:.4f} | {s['device']} |",
    ])


def pick_device(name: str) -> str:
    """--device -> a device name; cuda on a machine without it (or a GPU it does not have) is one line."""
    from ..config import ConfigError

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name}: use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: no CUDA device is available here (torch {torch.__version__}); "
                              "use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type != "cpu":
        raise ConfigError(f"--device {name}: use cpu, cuda, cuda:N or auto")
    return name


# ------------------------------------------------------------------------------------------ verbs
def eval_main(args) -> int:
    from ..formats.run_folder import describe_weights, folder_kind

    device = pick_device(args.device)
    from ..config import data_path

    args.data = data_path(args.data)  # data/demo/valid.jsonl names the shipped set when there is no such file here
    cfg, model, tok, w = load_run(args.model, args.weights, device)
    family = family_of(cfg)
    if family.eval_main is not None:  # a family that does not decode audio measures itself
        return family.eval_main(args, cfg, model, tok, w, device)
    from .testset import items_of, read_items

    if family.eval_set is not None:  # the family's own jsonl layout
        items = items_of(*family.eval_set(args.data, cfg))
    else:
        items = read_items([args.data], skip_bad=cfg.data.skip_bad)
    missing = [it for it in items if it.ref is None]
    if missing:
        raise DataError(f"{args.data}: {missing[0].key} has no reference (an assistant answer); brisk eval scores "
                        "against references: give a FunASR jsonl, or use brisk transcribe for bare audio")
    run = Path(args.model)
    which = describe_weights(run, w, cfg.train.keep_metric) if folder_kind(run) == "run" else f"weights: {w or run}"
    print(which, flush=True)  # before the decode, once
    out = Path(args.out) if args.out else default_out(Path(args.model), Path(args.data))
    if not out.with_suffix(".summary.json").exists():  # names the set from the start: a stopped eval resumes into it
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".summary.json").write_text(json.dumps({"data": str(Path(args.data).resolve())}) + "\n",
                                                    encoding="utf-8")
    rec = recognizer(cfg, model, tok, device, **decoder_options(args))
    with frozen_gc(rec.fast):
        rows, s = evaluate(rec, items, out, args.batch_size, resume=args.resume, max_utts=args.max_utts,
                           progress=show_progress(args), threads=args.host_threads)
    print(f"model: {args.model}; data: {args.data}")
    print(summary_table(s))
    if len(rows) < len(items):
        print(f"{len(rows)} of {len(items)} utterances decoded so far (--max-utts); the table covers those; "
              f"--resume continues into {out}")
    if s["empty_refs"]:
        print(f"{s['empty_refs']} utterance(s) have an empty reference (nothing left after normalisation): each "
              f"character of their hypotheses counts as an insertion; they are flagged empty_ref in {out}")
    print(f"decoding: {s['utts_per_s']:.2f} utterances/s, real-time factor {s['rtf']:.4f} "
          f"({s['seconds']:.1f} s for {s['audio_seconds']:.1f} s of audio, {s['decoded_now']} utterances decoded now, "
          f"batch {s['batch_size']}, greedy, {s['decoder']})")
    print(f"per utterance: {out}")
    s["data"] = str(Path(args.data).resolve())  # which set this file scores: default_out keeps sets apart by it
    (out.with_suffix(".summary.json")).write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    return 0


def default_out(model: Path, data: Path) -> Path:
    """Where `brisk eval` writes without --out: ``eval/<stem>.jsonl`` of the run, or for an export inside a run
    folder (which `brisk export` rewrites whole) the run's ``eval/<export folder>/``. A file of that name that
    scores another data set is kept: this one takes the next free ``<stem>-2.jsonl``, ``-3``, ... (the summary
    beside each names its set, so --resume finds its own)."""
    from ..formats.run_folder import folder_kind

    base = model / "eval"
    # (a parent with a config.yaml is a run or a FunASR folder: folder_kind has no error to raise for it)
    if folder_kind(model) != "run" and (model.parent / "config.yaml").is_file() and folder_kind(model.parent) == "run":
        base = model.parent / "eval" / model.name
    want = str(data.resolve())
    for n in range(1, 1000):
        out = base / (f"{data.stem}.jsonl" if n == 1 else f"{data.stem}-{n}.jsonl")
        summary = out.with_suffix(".summary.json")
        if not out.exists() and not summary.exists():
            return out
        try:
            if json.loads(summary.read_text(encoding="utf-8")).get("data") == want:
                return out
        except (OSError, ValueError):
            continue
    raise ConfigError(f"{base}: 999 evaluations of sets named {data.stem}; give --out")


def audio_note(paths: list[str], fs: int) -> str | None:
    """One line saying which files are resampled to ``fs`` or down-mixed to mono before decoding (headers
    only; the decode does the conversion), or None when every file is already mono at ``fs``."""
    import soundfile as sf

    rates, stereo = {}, []
    for p in paths:
        try:
            info = sf.info(p)
        except (sf.LibsndfileError, RuntimeError, OSError):
            continue  # the decode names it
        if info.samplerate != fs:
            rates.setdefault(info.samplerate, []).append(p)
        if info.channels > 1:
            stereo.append(p)
    parts = [f"{len(v)} file(s) resampled from {r} Hz to {fs} Hz (first: {v[0]})" for r, v in sorted(rates.items())]
    if stereo:
        parts.append(f"{len(stereo)} file(s) down-mixed to mono (first: {stereo[0]})")
    return "audio: " + "; ".join(parts) if parts else None


def encoder_dtype(args) -> dict:
    """--encoder-bf16 as the recognizer's keyword (absent otherwise: a family's recognizer may not take it)."""
    return {"encoder_dtype": torch.bfloat16} if getattr(args, "encoder_bf16", False) else {}


def show_progress(args) -> bool:
    return not args.no_progress and sys.stderr.isatty()


def decoder_options(args) -> dict:
    """`brisk eval` and `brisk transcribe`'s decoding flags as the recognizer's keywords."""
    return dict(max_new_tokens=args.max_new_tokens, fast=args.fast, fast_compile=compile_spec(args),
                device_features=not args.cpu_features, fast_buckets=args.fast_buckets,
                fast_multi_step=args.fast_multi_step, **encoder_dtype(args))


# --fast-compile-mode auto: measured on one H200 (docs/eval.md): max-autotune's Triton GEMM
# templates beat cuBLAS for one row (1.27 against 1.64 ms a token) and lose at 16 and 64 rows (1.7 vs 1.6, 2.4 vs
# 2.0 ms a step).
AUTO_TUNED_MAX_BATCH = 1


def compile_spec(args) -> str | None:
    """The fast decoder's torch.compile spec from --fast-compile and --fast-compile-mode (which implies it); auto
    picks max-autotune-no-cudagraphs for --batch-size 1 and Inductor's default mode above it."""
    mode = getattr(args, "fast_compile_mode", None)
    if mode == "auto":
        mode = "max-autotune-no-cudagraphs" if args.batch_size <= AUTO_TUNED_MAX_BATCH else "default"
    if mode:
        return f"inductor:{mode}"
    return args.fast_compile


def transcribe_main(args) -> int:
    from ..config import data_path
    from .testset import read_items, run_items

    if args.out and not args.out.endswith(".jsonl"):  # before a model is loaded: x.txt would hold jsonl otherwise
        raise ConfigError(f"--out {args.out}: transcripts are written as jsonl (key, audio, text a line); name the file "
                          "*.jsonl, or take the plain 'audio<TAB>text' lines from stdout (brisk transcribe ... > "
                          f"{args.out})")
    device = pick_device(args.device)
    args.audio = [data_path(a) for a in args.audio]
    cfg, model, tok, _ = load_run(args.model, args.weights, device)
    rec = recognizer(cfg, model, tok, device, **decoder_options(args))
    items = read_items(args.audio, skip_bad=cfg.data.skip_bad)
    note = audio_note([it.path for it in items], rec.fs)
    if note:  # on stderr: stdout holds only the transcripts
        print(f"INFO {note}", file=sys.stderr)
    if args.resume and not args.out:
        raise ConfigError("--resume continues the jsonl given by --out: give --out FILE")

    def row_of(item, result):
        return {"key": item.key, "audio": item.path, "text": result.text}

    out = Path(args.out) if args.out else None
    with frozen_gc(rec.fast):
        rows, _ = run_items(rec, items, out, row_of, args.batch_size, None, args.resume, args.max_utts,
                            show_progress(args), args.host_threads)
    if out is None or args.print:
        for row in rows:
            print(f"{row['audio']}\t{row['text']}")
    if out is not None:  # on stderr: stdout holds only the transcripts
        print(f"wrote {len(rows)} transcript(s) to {out}", file=sys.stderr)
    return 0


def host_threads_arg(text: str) -> int:
    """--host-threads, checked when the command line is read (before a results file is opened)."""
    try:
        n = int(text)
    except ValueError:
        n = -2
    if n < -1:
        raise argparse.ArgumentTypeError(f"{text!r}: use -1 (as they are), 0 (auto) or a count")
    return n


def add_verbs(sub) -> None:
    """`brisk eval` and `brisk transcribe` on the CLI's subparsers."""
    def common(p):
        p.add_argument("--weights", help="a run's weights: a checkpoint file, best (by validation keep_metric) or last (default: the newest "
                            "checkpoint, else the run's export)")
        p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
        p.add_argument("--batch-size", type=int, default=8, help="utterances decoded together (left padding)")
        p.add_argument("--max-new-tokens", type=int, default=512, help="FunASR's max_length (default 512)")
        p.add_argument("--fast", action="store_true",
                       help="static KV cache; on CUDA each batch bucket's decode step is a CUDA graph (same ids)")
        p.add_argument("--fast-compile", action="store_const", const="inductor", default=None,
                       help="--fast with the decode step compiled by torch.compile before capture (CUDA; compiles once)")
        p.add_argument("--fast-compile-mode", choices=(*COMPILE_MODES, "auto"), default=None,
                       help="--fast-compile with this Inductor mode (max-autotune-no-cudagraphs: GEMM kernels timed "
                            "against cuBLAS for each shape; compiles for minutes; on an H200 faster at --batch-size 1, "
                            "1.27 against 1.64 ms a token, slower at 16 and 64; auto: that mode at --batch-size 1, "
                            "the default above it)")
        p.add_argument("--fast-buckets", action="store_true",
                       help="--fast with the encoder and the prefill replayed from CUDA graphs per length bucket "
                            "(padded shapes: in bf16 ids may part from generate's at near-ties)")
        p.add_argument("--fast-multi-step", action="store_true",
                       help="--fast with one CUDA graph replay making several tokens (those between two checks of "
                            "the finished rows; the same kernels, the same ids)")
        p.add_argument("--encoder-bf16", action="store_true",
                       help="the audio encoder and adaptor as bf16 copies (several times faster on a GPU; features "
                            "change in the last bits, so a transcript may too)")
        p.add_argument("--resume", action="store_true",
                       help="continue the results jsonl a killed or --max-utts run left (same input, same batch size)")
        p.add_argument("--max-utts", type=int, default=None,
                       help="stop after the batch that reaches N utterances decoded in this call (--resume continues)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar (shown on a terminal by default)")
        p.add_argument("--cpu-features", action="store_true",
                       help="fbank + LFR one utterance at a time on the CPU (default: a batch at once on --device)")
        p.add_argument("--host-threads", type=host_threads_arg, default=0, metavar="N",
                       help="torch's CPU threads while decoding, put back after: N; -1 leave them as they are (torch's "
                            "default: one a core); 0 (default) one on a GPU with the features there (the host only "
                            "pads and copies; on an H200's VM, batch 64: 74 utts/s with 16 threads, 160 with one), "
                            "as they are otherwise")

    e = sub.add_parser("eval", help="decode a jsonl, CER/WER with jiwer, one line per utterance "
                                    "(a causal LM: loss, perplexity and greedy answers)")
    e.add_argument("model", help="a brisk run folder, or a model folder (a run's export, FunASR's or transformers')")
    e.add_argument("data", help="data with references, of any size: a FunASR jsonl (decoded in length-sorted batches; "
                                "Qwen3-ASR: its own jsonl too); a chat run: its chat data")
    e.add_argument("--out", help="per-utterance jsonl (default: MODEL/eval/<data>.jsonl)")
    e.add_argument("--answers", type=int, default=3, help="a chat run: conversations answered greedily and scored by exact match (default 3)")
    common(e)
    e.set_defaults(fn=eval_main)
    t = sub.add_parser("transcribe", help="print the transcript of each audio file")
    t.add_argument("model", help="a brisk run folder, or a model folder (a run's export, FunASR's or transformers')")
    t.add_argument("audio", nargs="+", help="audio files, folders of audio files, or FunASR jsonl files")
    t.add_argument("--out", help="stream the transcripts to this jsonl (key, audio, text), in input order at the end")
    t.add_argument("--print", action="store_true", help="with --out, also print a line per file")
    common(t)
    t.set_defaults(fn=transcribe_main)


def print_transcripts(first: dict, last: dict, rows: list[dict], n: int = 3) -> None:
    """The end of `brisk train` with train.val_decode: CER/WER before and after, and a few transcripts."""
    print(f"validation CER {100 * first['cer']:.1f}% (step {first['step']}) -> {100 * last['cer']:.1f}% "
          f"(step {last['step']}), WER {100 * first['wer']:.1f}% -> {100 * last['wer']:.1f}% "
          f"({last.get('decoded', len(rows))} utterances, greedy)")
    for row in rows[:n]:
        print(f"  {row['key']}  ref: {row['ref']}")
        print(f"  {' ' * len(row['key'])}  hyp: {row['hyp']}")
