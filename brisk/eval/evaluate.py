"""`brisk eval` and `brisk transcribe`: load a model, decode, score.

``load_run`` reads a brisk run folder (its config.yaml and its newest weights, or a chosen checkpoint), a
FunASR model folder or a native HF folder, through brisk.eval.load.load_for_inference.
Scoring: see brisk/eval/metrics.py for the normalisation; each line of the jsonl decodes its first audio
reference against its first assistant answer.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import yaml

from ..config import Config, ConfigError
from ..families import family_of
from .decode import Recognizer, timed_transcribe
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
    return cfg, model, tokenizer, w


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


def read_eval_set(path: str, cfg: Config) -> tuple[list[str], list[str], list[str]]:
    """(keys, audio paths, references) of a FunASR jsonl: each line's first audio and first answer."""
    from ..data.jsonl import read_jsonl

    d = cfg.data
    index = read_jsonl(path, max_speech_length=10**9, max_text_length=10**9, skip_bad=d.skip_bad)
    utts = index.utterances
    return [u.key for u in utts], [u.audio_paths()[0] for u in utts], [u.assistant[0] for u in utts]


def evaluate(rec: Recognizer, keys: list[str], paths: list[str], refs: list[str], out: Path | None,
             batch_size: int = 8, max_new_tokens: int | None = None) -> tuple[list[dict], dict]:
    results, seconds = timed_transcribe(rec, paths, batch_size, max_new_tokens)
    rows, summary = score(keys, refs, [r.text for r in results])
    audio = sum(r.audio_seconds for r in results)
    summary.update(seconds=seconds, audio_seconds=audio, utts_per_s=len(rows) / max(seconds, 1e-9),
                   rtf=seconds / max(audio, 1e-9), device=str(rec.device), batch_size=batch_size,
                   decoder=decoder_name(rec))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rows, summary


def decoder_name(rec: Recognizer) -> str:
    if not rec.fast:
        return "generate"
    return "fast decoder" + (f" (step compiled, {rec.fast_compile})" if rec.fast_compile else "")


def summary_table(s: dict) -> str:
    return "\n".join([
        "| utterances | CER | WER | char errors / chars | word errors / words | utts/s | RTF | device |",
        "|---|---|---|---|---|---|---|---|",
        f"| {s['utterances']} | {100 * s['cer']:.2f}% | {100 * s['wer']:.2f}% | {s['char_errors']} / {s['chars']} | "
        f"{s['word_errors']} / {s['words']} | {s['utts_per_s']:.2f} | {s['rtf']:.4f} | {s['device']} |",
    ])


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


# ------------------------------------------------------------------------------------------ verbs
def eval_main(args) -> int:
    from ..formats.run_folder import describe_weights, folder_kind

    device = pick_device(args.device)
    cfg, model, tok, w = load_run(args.model, args.weights, device)
    own = family_of(cfg).eval_main
    if own is not None:  # a family that does not decode audio measures itself
        return own(args, cfg, model, tok, w, device)
    own_set = family_of(cfg).eval_set
    keys, paths, refs = own_set(args.data, cfg) if own_set is not None else read_eval_set(args.data, cfg)
    run = Path(args.model)
    which = describe_weights(run, w, cfg.train.keep_metric) if folder_kind(run) == "run" else f"weights: {w or run}"
    print(which, flush=True)
    out = Path(args.out) if args.out else (Path(args.model) / "eval" / f"{Path(args.data).stem}.jsonl")
    rec = recognizer(cfg, model, tok, device, max_new_tokens=args.max_new_tokens, fast=args.fast,
                     fast_compile=args.fast_compile)
    rows, s = evaluate(rec, keys, paths, refs, out, args.batch_size)
    print(f"model: {args.model} ({which}); data: {args.data}")
    print(summary_table(s))
    if s["empty_refs"]:
        print(f"{s['empty_refs']} utterance(s) have an empty reference (nothing left after normalisation): each "
              f"character of their hypotheses counts as an insertion; they are flagged empty_ref in {out}")
    print(f"decoding: {s['utts_per_s']:.2f} utterances/s, real-time factor {s['rtf']:.4f} "
          f"({s['seconds']:.1f} s for {s['audio_seconds']:.1f} s of audio, batch {s['batch_size']}, greedy, "
          f"{s['decoder']})")
    print(f"per utterance: {out}")
    (out.with_suffix(".summary.json")).write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    return 0


def transcribe_main(args) -> int:
    device = pick_device(args.device)
    cfg, model, tok, _ = load_run(args.model, args.weights, device)
    rec = recognizer(cfg, model, tok, device, max_new_tokens=args.max_new_tokens, fast=args.fast,
                     fast_compile=args.fast_compile)
    for path, r in zip(args.audio, rec.transcribe(args.audio, args.batch_size)):
        print(f"{path}\t{r.text}")
    return 0


def add_verbs(sub) -> None:
    """`brisk eval` and `brisk transcribe` on the CLI's subparsers."""
    def common(p):
        p.add_argument("--weights", help="a weights file, or best / last checkpoint (default: the run's final model)")
        p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
        p.add_argument("--batch-size", type=int, default=8, help="utterances decoded together (left padding)")
        p.add_argument("--max-new-tokens", type=int, default=512, help="FunASR's max_length (default 512)")
        p.add_argument("--fast", action="store_true",
                       help="static KV cache; on CUDA each batch bucket's decode step is a CUDA graph (same ids)")
        p.add_argument("--fast-compile", action="store_const", const="inductor", default=None,
                       help="--fast with the decode step compiled by torch.compile before capture (CUDA; compiles once)")

    e = sub.add_parser("eval", help="decode a jsonl, CER/WER with jiwer, one line per utterance "
                                    "(a causal LM: loss, perplexity and greedy answers)")
    e.add_argument("model", help="a brisk run folder or a FunASR model folder")
    e.add_argument("data", help="a FunASR jsonl with references")
    e.add_argument("--out", help="per-utterance jsonl (default: MODEL/eval/<data>.jsonl)")
    e.add_argument("--answers", type=int, default=3, help="a causal LM: conversations answered greedily (default 3)")
    common(e)
    e.set_defaults(fn=eval_main)
    t = sub.add_parser("transcribe", help="print the transcript of each audio file")
    t.add_argument("model", help="a brisk run folder or a FunASR model folder")
    t.add_argument("audio", nargs="+")
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
