#!/usr/bin/env python3
"""Greedy decoding speed (issues 25, 34): FunASR's own inference, brisk's plain decoder and brisk's fast decoder.

One call: a real-size random Fun-ASR-Nano folder (tools/make_nano_folder.py, on the GPU) unless --model names
one; the 40 validation utterances of the whole-run set (bench/tmp/wholerun_data/valid.jsonl, made by
tools/make_wholerun_data.py) or, where that is missing, the bundled demo's 40; at most --max-new (64) new
tokens. Random weights rarely emit a stop token, so every row runs to the cap and every decoder generates the
same number of tokens.

Arms (each warmed once on its first batch: graph capture and compile are reported, not timed):
- funasr: FunASR 1.4.16's ``FunASRNano.inference`` one utterance at a time, the call ``AutoModel.generate``
  makes at its default batch 1, on FunASR's own model built from the folder (skipped, and said so, when
  funasr cannot be imported);
- plain: brisk's Recognizer (``llm.generate``, dynamic cache), batches 1, 16, 64;
- fast: the same with ``fast=True`` (static KV cache; the decode step brisk's own, brisk.eval.decode_step: the
  LLM's own GEMMs, attention over a bucket of the filled slots, a CUDA graph a batch bucket and span);
- fast_concat: fast with one q/k/v and one gate/up GEMM a layer (concatenated weights), eagerly graphed: against
  fast, what the GEMMs' partition does to the bf16 ids;
- fast_llm: ``fast=True`` with the LLM's own forward as the step (the step before the fused one: three q/k/v
  and two gate/up GEMMs, attention over the whole cache), graphed;
- fast_buckets: ``fast_buckets=True`` (also the encoder and the prefill replayed from graphs per length bucket);
- fast_compile, fast_compile_buckets, fast_compile_llm: those with the step compiled by Inductor before capture
  (the compiled step concatenates the GEMMs);
- any arm with the suffix _enc16: the encoder and adaptor as bf16 copies (``--encoder-bf16``); with _multi
  (before _enc16): ``--fast-multi-step``, one graph replay a check's tokens (its ids must equal the arm's without);
  with _tuned (before _multi): a compiled arm's step compiled in Inductor's max-autotune-no-cudagraphs mode
  (``--fast-compile-mode``: GEMM templates timed against cuBLAS per shape, epilogues fused; longer compile);
- fast_eos: ``fast_compile`` with one more stop token, picked from the batch-1 ids of fast_compile (else fast,
  else fast_buckets; a token most rows emit first mid-utterance), so rows stop at different lengths as a
  trained model's do; its ids are compared with that arm's cut at that token.

Per arm and batch: utterances/s and RTF of the whole transcribe (audio reading, features, encoder, decode;
what `brisk eval` reports), and ms a generated token of the decode alone (prompt embeddings ready; the time
of one ``generate`` of a full batch divided by the tokens it ran, the median of --repeats). Batch-1 rows of
the slow arms (funasr, plain) decode only the first --slow-utts utterances, to keep the call short. The
token ids of each fast arm are compared with plain's at the same batch size: for every utterance that differs,
the plain decoder's top-1 minus top-2 logit at the first differing token (recorded by a forward hook during
plain's timed run), in logits, in bf16 ulps of the top logit and as a percentile of plain's margins, so that
bf16 near-ties are told from a real divergence; plain against itself across batch sizes gives the near-ties'
scale. Writes decode_bench.json and decode_bench.md to --out and prints the table last.

    python bench/decode_bench.py --out $OUT/decode                          # GPU, ~5 minutes
    python bench/decode_bench.py --tiny --device cpu --out bench/tmp/decode_tiny --arms plain,fast,fast_concat,\
        fast_llm,fast_compile,fast_eos,fast_enc16 --batches 1,4 --utts 6 --slow-utts 2 --max-new 8 --repeats 1 \
        --compile eager
                                                                                 # CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_folder(out: Path, tiny: bool) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, str(REPO / "tools" / "make_nano_folder.py"), "--out", str(out)] + (["--tiny"] if tiny else [])
    subprocess.run(cmd, check=True, cwd=REPO)
    return time.perf_counter() - t0


def timed(fn, device: str, repeats: int):
    """(median seconds of ``repeats`` calls, the last result)."""
    times, out = [], None
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def decode_only(rec, paths: list[str], max_new: int, repeats: int, device: str,
                kernels: bool = False) -> tuple[dict, list[list[int]]]:
    """Where one batch's time goes, stage by stage (each the median of ``repeats``, after a warm-up that captures
    what the arm captures): the whole batch's transcribe; its audio read (the recognizer's threaded reading);
    features of the batch on the device (Frontend.batch) and, for reference, the CPU path one utterance at a
    time; encoder + adaptor; the splice into the prompt; the prefill (generate of 1 token); the decode steps (a
    full generate less the prefill, over the steps it ran); the rest of the whole (host work: text, lists,
    syncs); and the batch's ids."""
    import torch

    t_read, waves = timed(lambda: rec.read(paths), "cpu", repeats)  # the recognizer's own (threaded) reading
    from brisk.diagnose.slow import GCWatch

    with GCWatch() as gc_watch:  # Python's garbage collections inside the whole batch: host time in no stage
        t_whole, _ = timed(lambda: rec.transcribe(paths, len(paths)), device, repeats)  # the batch end to end
    with torch.no_grad():
        t_cpu, _ = timed(lambda: [rec.frontend(w) for w in waves], "cpu", 1)
        speech, lengths = rec.frontend.batch(waves, device)  # warm-up: constants on the device
        t_feats, (speech, lengths) = timed(lambda: rec.frontend.batch(waves, device), device, repeats)
        embeds, mask = rec.splice(rec.encode(speech, lengths), lengths.tolist())  # warm-up: encoder capture
        t_enc, adapted = timed(lambda: rec.encode(speech, lengths), device, repeats)
        t_splice, (embeds, mask) = timed(lambda: rec.splice(adapted, lengths.tolist()), device, repeats)
        rec.generate(embeds, mask, max_new)  # warm-up: the room at its full length, prefill and step captured
        t_prefill, _ = timed(lambda: rec.generate(embeds, mask, 1), device, repeats)
        t_all, out = timed(lambda: rec.generate(embeds, mask, max_new), device, repeats)
        replays = rec._fast.replays if rec._fast is not None else None
        rec.generate(embeds, mask, max_new)
        replays = rec._fast.replays - replays if replays is not None else None  # of one full generate
        # 17 tokens: the prefill's and two checks of 8 steps (a full generate's events would take long to gather).
        kern = kernel_profile(lambda: rec.generate(embeds, mask, min(17, max_new))) if kernels else None
        kern_prefill = kernel_profile(lambda: rec.generate(embeds, mask, 1)) if kernels else None
    rows = out.tolist()
    steps = max(next((j + 1 for j, x in enumerate(r) if x in rec.stop), len(r)) for r in rows)
    stages = t_read + t_feats + t_enc + t_splice + t_all
    return {"read_ms": 1000 * t_read, "features_ms": 1000 * t_feats, "features_cpu_ms": 1000 * t_cpu,
            "encoder_ms": 1000 * t_enc, "splice_ms": 1000 * t_splice, "embeds_ms": 1000 * (t_enc + t_splice),
            "prefill_ms": 1000 * t_prefill, "ms_per_token": 1000 * t_all / max(steps, 1),
            "step_ms": 1000 * (t_all - t_prefill) / max(steps - 1, 1), "steps": steps, "batch_ms": 1000 * t_whole,
            "generate_ms": 1000 * t_all, "other_ms": 1000 * (t_whole - stages), "profiled_utts": len(paths),
            "replays": replays, "gc_ms": 1000 * gc_watch.seconds / repeats,
            "gc_collections": gc_watch.collections / repeats,
            **({"kernels": kern, "prefill_kernels": kern_prefill} if kern else {})}, rows


def kernel_profile(fn, top: int = 15) -> dict:
    """The GPU kernels of one call (torch.profiler; kernels inside replayed CUDA graphs included), with
    brisk.bench.profile's measures: how many, the busy share of their span (first kernel's start to last one's
    end; the rest is the GPU idle between kernels), device ms by kernel class, and the ``top`` kernels by time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from brisk.bench.profile import busy_fraction, is_kernel, kernel_classes

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = prof.events()
    ks = [e for e in events if is_kernel(e)]
    if not ks:
        return {"kernels": 0}
    span = max(e.time_range.end for e in ks) - min(e.time_range.start for e in ks)
    by: dict[str, list[float]] = {}
    for e in ks:
        by.setdefault(e.name[:90], []).append(e.time_range.end - e.time_range.start)
    best = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"kernels": len(ks), "span_us": round(span, 1), "busy_share": round(busy_fraction(events), 3),
            "classes": [[c, k, round(ms, 3)] for c, k, ms in kernel_classes(events, 1)],
            "top": [[name, len(d), round(sum(d), 1)] for name, d in best]}


def host_profile(rec, paths: list[str], out: Path, name: str, top: int = 25) -> list[list]:
    """cProfile of one whole-batch transcribe (the main thread's Python: where the host waits and what it does
    between the stages); the ``top`` functions by their own time into ``out``/host_<name>.txt, and returned."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    rec.transcribe(paths, len(paths))
    if rec.device.type == "cuda":
        import torch

        torch.cuda.synchronize(rec.device)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).sort_stats("tottime")
    stats.print_stats(top)
    (out / f"host_{name}.txt").write_text(buf.getvalue())
    rows = sorted(((f"{Path(f).name}:{line}({fn})", round(1000 * v[2], 2), v[1]) for (f, line, fn), v in
                   stats.stats.items()), key=lambda r: -r[1])
    return [list(r) for r in rows[:top]]


def arm_parts(name: str) -> tuple[str, bool, bool, bool]:
    """An arm's name -> (base arm, _tuned, _multi, _enc16), the suffixes in that order."""
    enc16 = name.endswith("_enc16")
    name = name.removesuffix("_enc16")
    multi = name.endswith("_multi")
    name = name.removesuffix("_multi")
    return name.removesuffix("_tuned"), name.endswith("_tuned"), multi, enc16


def brisk_arm(name: str, cfg, model, tok, device: str, paths: list[str], audio: list[float], batch: int, a) -> dict:
    from brisk.diagnose.timer import steal_seconds, steal_share
    from brisk.eval.decode import timed_transcribe
    from brisk.eval.evaluate import frozen_gc, recognizer

    import torch

    base, tuned, multi, enc16 = arm_parts(name)
    spec = f"{a.compile}:max-autotune-no-cudagraphs" if tuned else a.compile  # --fast-compile-mode
    kw = {"fast": base != "plain",
          "fast_compile": spec if base.startswith("fast_compile") or base == "fast_eos" else None,
          "fast_buckets": base in ("fast_buckets", "fast_compile_buckets")}
    if enc16:  # --encoder-bf16
        kw["encoder_dtype"] = torch.bfloat16
    if multi:  # --fast-multi-step
        kw["fast_multi_step"] = True
    rec = recognizer(cfg, model, tok, device, max_new_tokens=a.max_new, **kw)
    rec.fast_fused = not base.endswith("_llm")
    if base == "fast_concat":  # the eager step with concatenated q/k/v and gate/up GEMMs
        rec.fast_fuse = True
    if base == "fast_eos":  # a model that stops: one more stop token, one the random model emits mid-utterance
        rec.stop = sorted({*rec.stop, a.eos_token})
    # As `brisk eval --fast` decodes: the objects alive now left out of Python's collections (frozen_gc).
    with frozen_gc(rec.fast):
        n = a.slow_utts if (base == "plain" and batch == 1) else len(paths)
        t0 = time.perf_counter()
        if base != "plain":  # warm-up over the very batches timed: every bucket's capture (and compile) done here
            timed_transcribe(rec, paths[:n], batch, a.max_new)
        warm = time.perf_counter() - t0
        margins = Margins(rec.model.llm) if base == "plain" else None  # plain's top-1 - top-2 logit at each token
        passes, steal = [], []  # whole passes over the set, timed one after another: utts/s is their median
        for _ in range(1 if base == "plain" else max(1, a.passes)):
            s0 = steal_seconds()  # the hypervisor's share of this VM's CPUs during the pass (None: not counted)
            results, seconds = timed_transcribe(rec, paths[:n], batch, a.max_new)
            passes.append(seconds)
            steal.append(steal_share(s0, steal_seconds(), seconds))
        seconds = statistics.median(passes)
        profile, ids = {}, []
        if margins is not None:
            margins.remove()
            profile["margins"] = margins.rows()
        if base != "plain" or str(batch) in a.plain_profile.split(","):  # plain's stage profile costs minutes at 64
            profile.update(decode_only(rec, paths[:min(batch, n)], a.max_new, a.repeats, device,
                                       kernels=a.kernel_profile and base != "plain" and device.startswith("cuda"))[0])
            if a.host_profile and base != "plain":
                profile["host_top"] = host_profile(rec, paths[:min(batch, n)], Path(a.out), f"{name}_b{batch}")
    fused = rec._fast is not None and rec._fast.fused is not None
    fuse = fused and rec._fast.fused.fuse
    rec.release()
    return {"arm": name, "fused_step": fused, "fuse_gemms": fuse, "batch": batch, "utterances": n, "seconds": seconds,
            "utts_per_s": n / seconds, "utts_per_s_passes": [n / t for t in passes], "steal_passes": steal,
            "rtf": seconds / sum(audio[:n]),
            **profile, "warmup_s": warm,
            "ids": [r.ids for r in results], "batch_ids": ids,
            "tokens": sum(len(r.ids) for r in results), "tokens_per_utt": sum(len(r.ids) for r in results) / n}


class Margins:
    """The plain decoder's top-1 minus top-2 logit at every generated token of every row, from a forward hook on
    the LLM (generate's logits are the hook's output; nothing in the computation changes). A call with
    ``inputs_embeds`` is a batch's prefill: it starts the batch. Kept on the device until ``rows``."""

    def __init__(self, llm):
        self.batches: list[list] = []
        self.handle = llm.register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, out) -> None:
        if kwargs.get("inputs_embeds") is not None:
            self.batches.append([])
        top = out.logits[:, -1].float().topk(2, dim=-1).values  # [B, 2]
        self.batches[-1].append(top)

    def remove(self) -> None:
        self.handle.remove()

    def rows(self) -> list[list[list[float]]]:
        """Per utterance (in order), per generated token: [top-1 logit, top-1 - top-2]."""
        out = []
        for steps in self.batches:
            t = torch_stack(steps)  # [steps, B, 2]
            for r in range(t.shape[1]):
                out.append([[round(float(x), 4), round(float(x - y), 5)] for x, y in t[:, r].tolist()])
        return out


def torch_stack(xs):
    import torch

    return torch.stack(xs)


def pick_eos(rows: list[list[int]], max_new: int) -> int:
    """A token most rows emit first somewhere in the middle (median first position between a sixth and two
    thirds of ``max_new``), so that the EOS arm's rows stop at different, realistic lengths; else the most
    frequent token."""
    from collections import Counter

    first: dict[int, list[int]] = {}
    for r in rows:
        for j, x in enumerate(r):
            first.setdefault(x, [])
        for x in set(r):
            first[x].append(r.index(x))
    good = [(len(v), x) for x, v in first.items() if max_new // 6 <= sorted(v)[len(v) // 2] <= 2 * max_new // 3]
    if good:
        return max(good)[1]
    return Counter(x for r in rows for x in r).most_common(1)[0][0]


def funasr_arm(folder: Path, device: str, paths: list[str], audio: list[float], a) -> dict:
    """FunASR's FunASRNano.inference at batch 1 on its own model built from the folder's config.yaml."""
    import torch
    import yaml

    t0 = time.perf_counter()
    import funasr.models.llm_asr.adaptor  # noqa: F401  (registers the adaptor class)
    import funasr.models.sense_voice.model  # noqa: F401
    from funasr.frontends.wav_frontend import WavFrontend
    from funasr.models.fun_asr_nano.model import FunASRNano
    from transformers import AutoTokenizer

    conf = yaml.safe_load((folder / "config.yaml").read_text())
    llm_conf = dict(conf["llm_conf"], init_param_path=str(folder / conf["llm_conf"]["init_param_path"]))
    model = FunASRNano(audio_encoder=conf["audio_encoder"], audio_encoder_conf=conf["audio_encoder_conf"],
                       audio_adaptor=conf["audio_adaptor"], audio_adaptor_conf=conf["audio_adaptor_conf"],
                       llm=conf["llm"], llm_conf=llm_conf, input_size=560)
    state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    missing, unexpected = model.load_state_dict(state, strict=False)  # FunASR's own loader is not strict either
    model = model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(llm_conf["init_param_path"], local_files_only=True)
    frontend = WavFrontend(**conf["frontend_conf"], dither=0.0)
    load_s = time.perf_counter() - t0
    generated = []  # FunASR returns text only: greedy generate runs the LLM once a generated token
    model.llm.register_forward_hook(lambda *_: generated.append(1))

    def run(path: str, i: int) -> None:
        model.inference([path], key=[f"u{i}"], tokenizer=tok, frontend=frontend, device=device, max_length=a.max_new)

    t0 = time.perf_counter()
    run(paths[0], 0)
    warm = time.perf_counter() - t0
    generated.clear()
    n = a.slow_utts
    sync(device)
    t0 = time.perf_counter()
    for i, p in enumerate(paths[:n]):
        run(p, i)
    sync(device)
    seconds = time.perf_counter() - t0
    return {"arm": "funasr", "batch": 1, "utterances": n, "seconds": seconds, "utts_per_s": n / seconds,
            "rtf": seconds / sum(audio[:n]), "ms_per_token": 1000 * seconds / max(sum(generated), 1),
            "warmup_s": warm, "load_s": load_s, "tokens": sum(generated), "missing_keys": len(missing),
            "unexpected_keys": len(unexpected),
            "note": "per token: whole inference time / generated tokens (features and encoder included)"}


def divergence(ref: dict, ids: list[list[int]]) -> dict:
    """Utterances whose ids differ from ``ref``'s (the plain arm, with its logit margins), and for each the plain
    decoder's top-1 minus top-2 logit at the first differing token: in logits, in bf16 ulps of the top-1 logit
    (its rounding step), and as a percentile of every margin plain saw in that arm. Near-ties of bf16 rounding
    sit at a few ulps and the lowest percentiles; a real divergence (a wrong mask, position or weight) parts at
    ordinary margins, early."""
    import math

    pairs = list(zip(ref["ids"], ids))
    marg = ref.get("margins") or []
    every = sorted(m for row in marg for _, m in row)
    parts = []
    for i, (x, y) in enumerate(pairs):
        if x == y:
            continue
        j = next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        d = {"utt": i, "token": j}
        if i < len(marg) and j < len(marg[i]):
            top, m = marg[i][j]
            ulp = 2.0 ** (math.floor(math.log2(abs(top))) - 7) if top else 2.0 ** -133
            d.update(margin=m, ulps=round(m / ulp, 2),
                     percentile=round(100 * sum(e <= m for e in every) / max(len(every), 1), 2))
        parts.append(d)
    known = [d for d in parts if "margin" in d]
    out = {"compared": len(pairs), "differ": len(parts), "first_diff": parts}
    if known:
        out.update(max_margin=max(d["margin"] for d in known), max_ulps=max(d["ulps"] for d in known),
                   max_percentile=max(d["percentile"] for d in known), earliest=min(d["token"] for d in parts))
    if every:
        out["plain_median_margin"] = every[len(every) // 2]
    return out


def agreement(rows: list[dict]) -> dict:
    """Per fast arm and batch size: how many utterances' ids differ from plain's at that batch size, and where
    (``divergence``); plain against itself across batch sizes as the scale of bf16 near-ties; fast_eos against
    its source arm cut at the EOS token (a share)."""
    out = {}
    plains = {r["batch"]: r for r in rows if r["arm"] == "plain"}
    for r in rows:
        if arm_parts(r["arm"])[0] == "fast_eos":
            ref = next((p for p in rows if p["arm"] == r["eos_from"] and p["batch"] == r["batch"]), None)
            if ref is not None:
                eos = r["eos_token"]
                pairs = list(zip([x[:x.index(eos)] if eos in x else x for x in ref["ids"]], r["ids"]))
                out[f"fast_eos b{r['batch']} (vs {ref['arm']} cut at the EOS token)"] = {
                    "compared": len(pairs), "differ": sum(x != y for x, y in pairs)}
        elif r["arm"].startswith("fast") and r["batch"] in plains:
            out[f"{r['arm']} b{r['batch']}"] = divergence(plains[r["batch"]], r["ids"])
    for r in rows:  # several tokens a replay against one a replay: the same kernels, so the same ids (0 differ)
        if "_multi" in r["arm"]:
            one = next((p for p in rows if p["arm"] == r["arm"].replace("_multi", "") and p["batch"] == r["batch"]), None)
            if one is not None:
                out[f"{r['arm']} b{r['batch']} vs {one['arm']}"] = {
                    "compared": len(r["ids"]), "differ": sum(x != y for x, y in zip(one["ids"], r["ids"]))}
    for b, p in plains.items():  # plain at another batch size: its own near-ties (padding changes its shapes)
        for b2, q in plains.items():
            if b2 > b:
                out[f"plain b{b2} vs plain b{b}"] = divergence(p, q["ids"][:len(p["ids"])])
    return out


def agreement_lines(agree: dict) -> list[str]:
    """One line a comparison: 'k of n differ, all at margins <= X (U ulps, the lowest P% of plain's)'."""
    lines = []
    for name, d in agree.items():
        line = f"- {name}: {d['differ']} of {d['compared']} differ"
        if d.get("max_margin") is not None:
            line += (f", all at plain margins <= {d['max_margin']:.4g} ({d['max_ulps']:g} bf16 ulps of the top logit; "
                     f"within the lowest {d['max_percentile']:g}% of plain's margins, median "
                     f"{d.get('plain_median_margin', float('nan')):.3g}), the earliest at token {d['earliest']}")
        elif d["differ"]:
            line += " (no plain margins recorded for these)"
        lines.append(line)
    return lines


def table(rows: list[dict], skipped: dict, meta: dict) -> str:
    lines = [f"Greedy decoding, {meta['utterances']} utterances ({meta['audio_s']:.1f} s of audio), at most "
             f"{meta['max_new']} new tokens, {meta['device']}, LLM {meta['llm_dtype']}, torch {meta['torch']}, "
             f"transformers {meta['transformers']}, torch CPU threads {meta.get('torch_threads', '-')}", "",
             "| decoder | batch | utterances | utterances/s | RTF | tokens / utt | ms / generated token (decode only) | "
             "decode step ms | prefill ms | encoder ms | splice ms | features ms (device, batch) | read audio ms | "
             "one batch ms | rest of the batch ms | GC ms in the batch | replays a generate | "
             "features ms (CPU, one by one) | warm-up s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    names = {"funasr": "FunASR FunASRNano.inference (AutoModel.generate, batch 1)", "plain": "brisk plain (generate)",
             "fast": "brisk fast (brisk's step, the LLM's GEMMs, graphs a span)",
             "fast_concat": "brisk fast, concatenated q/k/v and gate/up GEMMs",
             "fast_llm": "brisk fast, the LLM's forward as the step (graph)",
             "fast_buckets": "brisk fast, length buckets (graphs: encoder, prefill, step)",
             "fast_compile": "brisk fast + compiled step (concatenated GEMMs)",
             "fast_compile_llm": "brisk fast + the LLM's forward compiled as the step",
             "fast_compile_buckets": "brisk fast, length buckets + compiled step",
             "fast_eos": "brisk fast + compiled step, stopping at an EOS token"}
    for r in rows:
        tok = (f"{r['ms_per_token']:.2f}" if "ms_per_token" in r else "-") + (" (whole call)" if r["arm"] == "funasr" else "")
        prof = " | ".join(f"{r[k]:.{0 if k == 'replays' else 1}f}" if r.get(k) is not None else "-" for k in
                          ("step_ms", "prefill_ms", "encoder_ms", "splice_ms", "features_ms", "read_ms", "batch_ms",
                           "other_ms", "gc_ms", "replays", "features_cpu_ms"))
        base, tuned, multi, enc16 = arm_parts(r["arm"])
        name = names[base] + (", max-autotune" if tuned else "") + (", several tokens a replay" if multi else "") \
            + (", encoder bf16" if enc16 else "")
        if r.get("fused_step") is False and base != "plain" and not base.endswith("_llm"):
            name += " [fused step refused: the LLM's forward]"
        ups = r.get("utts_per_s_passes") or []
        spread = f" ({min(ups):.1f}-{max(ups):.1f} over {len(ups)} passes)" if len(ups) > 1 else ""
        lines.append(f"| {name} | {r['batch']} | {r['utterances']} | {r['utts_per_s']:.2f}{spread} | {r['rtf']:.4f} | "
                     f"{r.get('tokens_per_utt', 0):.1f} | {tok} | {prof} | {r['warmup_s']:.1f} |")
    for arm, why in skipped.items():
        lines.append(f"| {names.get(arm_parts(arm.split()[0])[0], arm)} | "
                     f"{arm.split()[1][1:] if ' ' in arm else '-'} | - | not run: {why} | | | | | | | | | | | | | | | |")
    lines += ["", "utterances/s: the whole transcribe of the utterances (audio reading, features, encoder, decode), "
              "batches sorted as given, after a warm-up over the same batches (every bucket captured and compiled "
              "before the timing); the stage columns profile the first batch (the whole set at 64): decode step ms: "
              "(generate of the cap - generate of 1 token) / (steps - 1); prefill ms: generate of 1 token; encoder: "
              "encoder + adaptor of the batch; splice: the prompt embeddings; features: fbank + LFR of the batch on "
              "the device (Frontend.batch); read audio: the recognizer's threaded read of the batch's files; one "
              "batch: its whole transcribe; rest: one batch less read, features, encoder, splice and the full "
              "generate (host work); GC: Python's garbage collections during one batch; replays: the decode "
              "step's graph replays in one generate of the cap (one a token, or one a check with _multi); the CPU "
              "features one utterance at a time for reference."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/tmp/decode_bench")
    ap.add_argument("--model", default=None, help="a FunASR model folder (default: <work>/nano, built by "
                    "tools/make_nano_folder.py unless there)")
    ap.add_argument("--work", default="/tmp/brisk_decode_bench", help="the built model folder and the Inductor cache "
                    "(kept out of --out, which comes back from the GPU machine)")
    ap.add_argument("--data", default=None, help="a jsonl (default: bench/tmp/wholerun_data/valid.jsonl, else the demo's)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny model folder (CPU check of this script)")
    ap.add_argument("--arms", default="fast_compile_buckets_enc16,plain,fast,fast_concat,fast_llm,fast_compile,"
                    "fast_compile_buckets,fast_eos,funasr", help="arms in order; a suffix _enc16 runs the encoder "
                    "as bf16 copies (--encoder-bf16)")
    ap.add_argument("--eos-token", type=int, default=None, dest="eos_token",
                    help="the fast_eos arm's extra stop token (default: picked from the batch-1 ids of an earlier arm)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--arm-batches", default="", help="per-arm batches, e.g. fast:16,fast_llm:16 (others: --batches)")
    ap.add_argument("--plain-profile", default="1,16,64", help="batches at which the plain arm's stages are profiled")
    ap.add_argument("--utts", type=int, default=40)
    ap.add_argument("--slow-utts", type=int, default=8, help="utterances of the batch-1 rows of funasr and plain")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--compile", default="inductor", help="the compiled arms' torch.compile backend (eager: a CPU "
                    "check of the script)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--passes", type=int, default=1,
                    help="timed whole passes over the utterances a fast arm (utts/s: their median; each pass listed)")
    ap.add_argument("--host-profile", action="store_true", dest="host_profile",
                    help="cProfile one whole batch of each fast arm (host_<arm>_b<batch>.txt in --out)")
    ap.add_argument("--kernel-profile", action="store_true", dest="kernel_profile",
                    help="torch.profiler of one generate of 17 tokens (and of 1) of each fast arm's profiled "
                         "batch: kernels, the GPU's busy share of their span, ms by kernel class, the top kernels")
    ap.add_argument("--threads", type=int, default=0, help="torch's intra-op CPU threads for the whole run, every "
                    "arm (torch.set_num_threads; 0: torch's default, one a core; brisk eval's own default on a GPU "
                    "is one, --host-threads: use 1 for its figures). Round 9, batch 64: 74 utts/s with 16, 160 with 1")
    ap.add_argument("--budget", type=float, default=420, help="seconds; arms not started by then are skipped")
    a = ap.parse_args()
    t_start = time.perf_counter()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Set before torch is imported: the compiled arm's kernels land in (and come back from) this folder.
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor"))
    import torch
    import transformers

    if a.threads:
        torch.set_num_threads(a.threads)
    from brisk.eval.evaluate import load_run
    from brisk.eval.testset import read_items

    meta: dict = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device,
                  "torch": torch.__version__, "transformers": transformers.__version__, "max_new": a.max_new,
                  "inductor_cache": os.environ["TORCHINDUCTOR_CACHE_DIR"], "torch_threads": torch.get_num_threads()}
    folder = Path(a.model).resolve() if a.model else work / ("nano_tiny" if a.tiny else "nano")
    if not (folder / "model.pt").exists():
        meta["folder_build_s"] = build_folder(folder, a.tiny)
    t0 = time.perf_counter()
    cfg, model, tok, _ = load_run(folder, device=a.device)
    meta["load_s"] = time.perf_counter() - t0
    meta["llm_dtype"] = str(model.llm_dtype).replace("torch.", "")
    data = a.data or next((str(p) for p in (REPO / "bench" / "tmp" / "wholerun_data" / "valid.jsonl",
                                             REPO / "data" / "demo" / "valid.jsonl") if p.exists()))
    meta["data"] = data
    paths = [it.path for it in read_items([data])]
    paths = (paths * (1 + a.utts // len(paths)))[:a.utts]
    from brisk.data.audio import read_audio
    from brisk.families import section

    audio = [read_audio(p, section(cfg).frontend.fs).numel() / section(cfg).frontend.fs for p in paths]
    from brisk.eval.decode import READERS

    meta.update(utterances=len(paths), audio_s=sum(audio), reading_threads=READERS)
    rows, skipped = [], {}
    arms = a.arms.split(",")
    for arm in arms:
        if time.perf_counter() - t_start > a.budget:
            skipped[arm] = f"over the {a.budget:.0f} s budget"
            continue
        if arm == "funasr":
            try:
                rows.append(funasr_arm(folder, a.device, paths, audio, a))
            except Exception as e:  # noqa: BLE001 - funasr missing or failing: said in the table
                skipped[arm] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()  # FunASR's model is gone: its memory back before brisk's arms
            continue
        per_arm = dict(x.split(":", 1) for x in a.arm_batches.split(",") if x)
        for b in (int(x) for x in per_arm.get(arm, a.batches).replace("/", ",").split(",")):
            if time.perf_counter() - t_start > a.budget:
                skipped[f"{arm} b{b}"] = f"over the {a.budget:.0f} s budget"
                continue
            eos_from = next((x for x in ("fast_compile", "fast", "fast_buckets", "fast_compile_buckets")
                             if any(r["arm"] == x and r["batch"] == 1 for r in rows)), None)
            if arm_parts(arm)[0] == "fast_eos" and a.eos_token is None:
                if eos_from is None:
                    skipped[f"{arm} b{b}"] = "no batch-1 ids to pick an EOS token from (run fast_compile or fast first)"
                    continue
                ref = next(r for r in rows if r["arm"] == eos_from and r["batch"] == 1)
                a.eos_token = pick_eos(ref["ids"], a.max_new)
                meta["eos_token"] = a.eos_token
            try:
                rows.append(brisk_arm(arm, cfg, model, tok, a.device, paths, audio, b, a))
            except Exception as e:  # noqa: BLE001 - one arm failing on the device: said in the table, the rest run
                skipped[f"{arm} b{b}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                import traceback

                traceback.print_exc()
                continue
            if arm == "fast_eos":
                rows[-1]["eos_token"] = a.eos_token
                rows[-1]["eos_from"] = eos_from
            print(json.dumps({k: v for k, v in rows[-1].items() if "ids" not in k}), flush=True)
            write(out, rows, skipped, meta, t_start)  # after every arm: a call stopped by its limit keeps the rest
    print(write(out, rows, skipped, meta, t_start))
    return 0


def kernel_line(r: dict, key: str, what: str) -> str:
    k = r[key]
    return (f"- {r['arm']} b{r['batch']}, {what}: {k['kernels']} kernels over {k['span_us'] / 1000:.1f} ms, the GPU "
            f"busy {100 * k['busy_share']:.0f}% of it; by class (kernels, ms): "
            + "; ".join(f"{c} {n:.0f} {ms:.1f}" for c, n, ms in k["classes"][:6]))


def write(out: Path, rows: list[dict], skipped: dict, meta: dict, t_start: float) -> str:
    """decode_bench.json and decode_bench.md of the rows so far; returns the table."""
    meta["fast_equals_plain"] = agreement(rows)
    meta["seconds"] = time.perf_counter() - t_start
    md = table(rows, skipped, meta)
    md += ("\n\nids against the plain decoder at the same batch size (the plain decoder's top-1 - top-2 logit at the "
           "first differing token of each utterance that differs):\n" + "\n".join(agreement_lines(meta["fast_equals_plain"])))
    kern = [kernel_line(r, key, what) for key, what in (("kernels", "a generate of 17 tokens"),
                                                           ("prefill_kernels", "the prefill (a generate of 1)"))
            for r in rows if (r.get(key) or {}).get("kernels")]
    if kern:
        md += "\n\nkernels (torch.profiler, one generate of the profiled batch):\n" + "\n".join(kern)
    (out / "decode_bench.json").write_text(json.dumps({"meta": meta, "rows": rows, "skipped": skipped}, indent=1))
    (out / "decode_bench.md").write_text(md + "\n")
    return md


if __name__ == "__main__":
    sys.exit(main())
