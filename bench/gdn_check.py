"""The Gated DeltaNet kernel check on this GPU (issue 30): flash-linear-attention's chunked gated delta rule and
short conv, forward and backward, against the fp32 per-token recurrence (brisk/diagnose/gdn_check.py), at
Qwen3.5's shapes (0.8B, 2B, 9B, 27B) on packed rows of mixed conversation lengths and at issue 640's reproducer
shapes; then the key-block widths 32 / 64 / 128 forced through brisk's launcher; then one layer's speed
against transformers' torch chunk function.

    python bench/gdn_check.py --out $OUT --jobs 6   # writes gdn_check.md and gdn_check.json

fla's Triton kernels are compiled and autotuned once per head count, head size and varlen/padded form (minutes of
one CPU core each on a cold cache): --jobs runs the shapes in parallel processes on the one GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def speed(heads=16, t=8192, k=128, reps=3) -> list[str]:
    """One layer's fwd + bwd, ms: fla (as brisk calls it) against transformers' torch chunk function (padded
    batch of one row)."""
    import torch

    from brisk.diagnose import gdn_check as G

    shape = G.Shape("speed", heads, k, k, (t,), padded=True, conv=0)
    x = G.make_inputs(shape, "cuda")
    leaves = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    out = []
    for name, fn in (("fla chunk_gated_delta_rule", G.fla_delta_rule(shape)),
                     ("transformers torch chunk", lambda **a: G.torch_chunk_varlen(**a, lengths=shape.lengths, padded=True))):
        G.grads(fn, leaves, x["do"])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            G.grads(fn, leaves, x["do"])
        torch.cuda.synchronize()
        out.append(f"| {name} | T {t}, H {heads}, K = V = {k} | {1000 * (time.perf_counter() - t0) / reps:.1f} |")
    return ["| kernel | shape | fwd + bwd ms |", "|---|---|---|", *out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/gdn_check"))
    ap.add_argument("--shapes", help="comma-separated shape names (default: all)")
    ap.add_argument("--widths", default="32,64,128")
    ap.add_argument("--jobs", type=int, default=1, help="shapes checked in parallel processes")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--merge", action="store_true", help="only merge the per-shape results under --out")
    args = ap.parse_args()
    if args.merge:
        from brisk.diagnose import gdn_check as G

        return merge(args.out, [s.name for s in G.SHAPES])
    if args.jobs > 1:
        return parallel(args)
    import torch
    import triton

    from brisk.diagnose import gdn_check as G
    from brisk.speed import fla_hopper
    from brisk.speed.llm_kernels import fla_refusal

    args.out.mkdir(parents=True, exist_ok=True)
    cap = torch.cuda.get_device_capability()
    window = fla_hopper.in_window(cap, fla_hopper.triton_version())
    fla_hopper.register_launcher()  # as speed.fla_kernels does: fla's refused gated backward at brisk's checked widths
    head = [f"GPU {torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]}), torch {torch.__version__}, Triton "
            f"{triton.__version__}; in fla's refused window: {window}; brisk's launcher widths {fla_hopper.PROVEN}", ""]
    shapes = [s for s in G.SHAPES if not args.shapes or s.name in args.shapes.split(",")]
    rows, notes = [], []
    for shape in shapes:
        t0 = time.time()
        inputs = G.make_inputs(shape, "cuda")
        ref = (G.reference_grads(shape, inputs), G.reference_grads(shape, inputs, perturb=True))
        why = fla_refusal([shape.k])
        if why:
            notes.append(f"{shape.name}: default path refused: {why}")
        else:
            got = G.check_delta_rule(shape, "cuda", ref=ref)
            bk = fla_hopper.block_width(shape.k) if window else fla_hopper.fla_block_width(shape.k)
            for r in got:
                r.kernel += f" (as brisk runs it: BK {bk}, {'brisk launcher' if window else 'fla launcher'})"
            rows += got
        for w in [int(x) for x in args.widths.split(",")] if shape.name in ("qwen3_5_2b", "qwen3_5_27b", "tiny_varlen_k64",
                                                                          "i640_b2_t256_h4_k128", "i640_b2_t1024_h4_k64") else []:
            try:
                rows += G.check_delta_rule(shape, "cuda", bk=w, ref=ref)
            except Exception as e:  # a width the kernel cannot launch at this K: say so, go on
                notes.append(f"{shape.name} BK {w}: {type(e).__name__}: {str(e)[:160]}")
        rows += G.check_conv(shape, "cuda")
        print(f"{shape.name}: {time.time() - t0:.1f} s, {sum(not r.ok for r in rows)} rows outside the bound so far",
              flush=True)
        torch.cuda.empty_cache()
    text = "\n".join(head) + G.table(rows) + "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    if not args.no_speed:
        text += "\n" + "\n".join(speed()) + "\n"
    (args.out / "gdn_check.md").write_text(text)
    (args.out / "gdn_check.json").write_text(json.dumps({"head": head, "notes": notes,
                                                         "rows": [asdict(r) for r in rows]}))
    print(text)


def parallel(args) -> None:
    """One process a shape, then one table of all rows (no speed table: the shapes share the GPU)."""
    from brisk.diagnose import gdn_check as G

    names = [s.name for s in G.SHAPES if not args.shapes or s.name in args.shapes.split(",")]
    procs, running = [], []
    for name in names:
        while len(running) >= args.jobs:
            running = [p for p in running if p.poll() is None]
            time.sleep(1)
        out = args.out / name
        cmd = [sys.executable, __file__, "--out", str(out), "--widths", args.widths]
        cmd += ["--shapes", name, "--no-speed"]
        out.mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen(cmd, stdout=open(out / "log.txt", "w"), stderr=subprocess.STDOUT)
        procs.append((name, p))
        running.append(p)
    for name, p in procs:
        p.wait()
    merge(args.out, names)


def merge(out: Path, names: list[str]) -> None:
    """One table of the per-shape results under ``out`` (a shape without one is named)."""
    from brisk.diagnose import gdn_check as G

    rows, notes, head = [], [], []
    for name in names:
        f = out / name / "gdn_check.json"
        if not f.is_file():
            notes.append(f"{name}: no result (see {name}/log.txt)")
            continue
        res = json.loads(f.read_text())
        head, notes = res["head"], notes + res["notes"]
        rows += [G.Row(**r) for r in res["rows"]]
    text = "\n".join(head) + G.table(rows) + "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    (out / "gdn_check.md").write_text(text)
    (out / "gdn_check.json").write_text(json.dumps({"head": head, "notes": notes, "rows": [
        {**asdict(r), "bound": r.bound, "ok": r.ok} for r in rows]}))
    print(text)


if __name__ == "__main__":
    main()
