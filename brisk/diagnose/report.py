"""`brisk report RUN`: the step-time picture of a run, as report.png and report.md in the run folder.

With several ranks (steps.rank<r>.jsonl beside steps.jsonl) the plot is rank 0's; the markdown adds a table
per rank, the job's step time (the slowest rank each step) and every rank's slow steps, tagged.

Panels: every step's time with slow steps marked by cause and the running median; a histogram; the median
phase breakdown (data, forward, backward, optimizer, between-step work; a CUDA-graphed step is one replay,
shown as one "whole graphed step" bar); memory (peak allocated per step on a GPU, tokens per step on the
CPU); the training loss (metrics.jsonl) with the validation loss (history.jsonl); accuracy likewise; where the run decoded (train.val_decode),
validation CER and WER; where the run's time went, from the process's start to the export (timeline.json: start-up,
data, model, validation, and the training split into captures, compiles, new shapes and steady steps). The
markdown holds the acceleration state, summary numbers (GPU-only columns only on a GPU), the same time budget as a
table, the slow steps with their causes, and the validation history.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..plan import SWITCH_KEYS
from .timeline import read as read_timeline

CAUSE_COLORS = {"plan_build": "#d62728", "new_shape": "#ff7f0e", "recompile": "#9467bd", "graph_capture": "#e377c2",
                "data": "#1f77b4", "checkpoint": "#2ca02c", "validation": "#17becf", "gc": "#8c564b", "unknown": "#7f7f7f"}


def one_line(state: dict) -> str:
    s = state["speed"]
    # accel.json of older runs has no switches_on: the switches of the plan's table that are set there
    on = state.get("switches_on") or [k for k in SWITCH_KEYS if s.get(k) and k not in ("sdpa_backends", "encoder_dtype")]
    parts = [
        f"device={state.get('gpu', state['device'])}" + (f" ({state['capability']})" if "capability" in state else ""),
        f"torch={state['torch']}" + (f" cuda={state['cuda']} cudnn={state['cudnn']}" if "cuda" in state else ""),
        f"llm={state['llm_dtype']} encoder={state['encoder_dtype']}",
        (f"preset={state['preset']} " if state.get("preset") else "") + f"switches={','.join(on) or 'none (eager defaults)'}",
        f"sdpa_backends={s['sdpa_backends'] or 'torch default'} order={'>'.join(state['sdpa_order'])}",
        f"tf32={state['flags']['matmul.allow_tf32']}",
    ]
    if s["compile"]:
        parts.append(f"compile=scope:{s['compile_scope']},dynamic:{s['compile_dynamic']}")
    return "acceleration: " + " | ".join(parts)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def running_median(values: list[float], window: int = 50) -> list[float]:
    return [statistics.median(values[max(0, i - window + 1): i + 1]) for i in range(len(values))]


def summarize(steps: list[dict], slow: list[dict]) -> dict:
    totals = [s["total"] for s in steps]
    med = lambda k: statistics.median([s[k] for s in steps]) if steps else 0.0  # noqa: E731
    return {
        "steps": len(steps),
        "mean": statistics.fmean(totals) if totals else 0.0,
        "median": statistics.median(totals) if totals else 0.0,
        "p90": sorted(totals)[int(0.9 * (len(totals) - 1))] if totals else 0.0,
        "slow": len(slow),
        "slow_time": sum(s["total"] - s["median"] for s in slow),
        "phases": {k: med(k) for k in ("data", "forward", "backward", "optimizer")},
        "mem_peak_gb": max((s.get("mem_peak_gb", 0.0) for s in steps), default=0.0),
        "causes": {c: sum(1 for s in slow if s["cause"] == c) for c in sorted({s["cause"] for s in slow})},
    }


def graphed(steps: list[dict]) -> bool:
    """A CUDA-graphed step replays forward, backward and the update as one graph: only its whole is timed."""
    return bool(steps) and all(s["forward"] == 0 and s["backward"] == 0 for s in steps) and any(s["optimizer"] > 0 for s in steps)


def phase_bars(steps: list[dict]) -> list[tuple[str, float]]:
    """(label, median seconds) of the phase chart."""
    phases = ["data", "forward", "backward", "optimizer"]
    other = statistics.median([max(0.0, s["total"] - sum(s[p] for p in phases)) for s in steps])
    med = {p: statistics.median([s[p] for s in steps]) for p in phases}
    if graphed(steps):
        return [("data", med["data"]), ("whole graphed step", med["optimizer"]), ("between steps", other)]
    return [(p, med[p]) for p in phases] + [("between steps", other)]


COMPILE_SEEN = 0.05  # seconds of torch.compile in a step (cache loads included) that make it a compiling step


def step_kinds(steps: list[dict]) -> list[tuple[str, list[dict]]]:
    """The steps by what made them cost: a CUDA-graph capture (the first batch of a bucket), a compile, a batch
    shape seen for the first time, or none of these (steady)."""
    # a capture counter falls below 0 at release(), when graphs are dropped: such a step captured nothing
    captured = lambda s: s.get("step_captures", 0) > 0 or s.get("audio_captures", 0) > 0  # noqa: E731
    kinds = {"captured a CUDA graph (a bucket's first batch)": [], "compiled new graphs": [],
             "first batch of a new shape": [], "steady": []}
    for s in steps:
        key = ("captured a CUDA graph (a bucket's first batch)" if captured(s) else
               "compiled new graphs" if s.get("compiles", 0) or s.get("compile_s", 0) > COMPILE_SEEN else
               "first batch of a new shape" if s.get("new_shape") else "steady")
        kinds[key].append(s)
    return [(k, v) for k, v in kinds.items() if v]


def time_budget(steps: list[dict], timeline: dict) -> list[tuple[str, float, str]]:
    """(phase, seconds, note) from launch to the end of the export: timeline.json's spans, the training span
    split into its steps by kind (step_kinds) and the work between them (validation, checkpoints, gc)."""
    rows = []
    for span in timeline["spans"]:
        rows.append((span["name"], span["seconds"], ""))
        if not span["name"].startswith("training"):
            continue
        inside = 0.0
        for kind, group in step_kinds(steps):
            sec = sum(s["data"] + s["compute"] for s in group)
            comp = sum(s.get("compile_s", 0.0) for s in group)
            split = {k: sum(s.get("compile_split", {}).get(k, 0.0) for s in group) for k in ("trace", "backend", "backward")}
            note = (f"{len(group)} steps, median {statistics.median(s['data'] + s['compute'] for s in group) * 1000:.1f} ms"
                    + (f", of which {comp:.1f} s compiling (Dynamo's trace {split['trace']:.1f} s, AOTAutograd and "
                       f"Inductor or their cache {split['backend']:.1f} s, backward graphs {split['backward']:.1f} s)"
                       if comp > COMPILE_SEEN else ""))
            rows.append((f"– steps: {kind}", sec, note))
            inside += sec
        for name, sec in timeline.get("details", {}).get("training", {}).items():
            if name != "compile":  # inside the steps above, not beside them
                rows.append((f"– {name.replace('_', ' ')}", sec, ""))
                inside += sec
        rows.append(("– the loop's own work (logging, metrics, batches to the device)", max(0.0, span["seconds"] - inside), ""))
    return rows


def plot_decoding(ax, history: list[dict]) -> None:
    """Validation CER and WER where the run decoded (train.val_decode)."""
    dec = [h for h in history if "cer" in h]
    xs = [h["step"] for h in dec]
    ax.plot(xs, [100 * h["cer"] for h in dec], "o-", color="#1f77b4", label="CER")
    ax.plot(xs, [100 * h["wer"] for h in dec], "s--", color="#ff7f0e", label="WER")
    ax.set_xlabel("step")
    ax.set_ylabel("%")
    ax.legend(fontsize=8)
    ax.set_title(f"validation CER / WER (greedy, {dec[-1].get('decoded', '?')} utterances)")


def plot_timeline(ax, budget: list[tuple[str, float, str]]) -> None:
    """One bar from the process's start to the end of the export: each span, the training span as its parts."""
    parts = [(name.removeprefix("– "), sec) for i, (name, sec, _) in enumerate(budget)
             if name.startswith("– ") or not (i + 1 < len(budget) and budget[i + 1][0].startswith("– "))]
    cmap = __import__("matplotlib").colormaps["tab20"]
    left = 0.0
    for i, (name, sec) in enumerate(parts):
        ax.barh([0], [sec], left=left, color=cmap(i % 20), label=f"{name}: {sec:.1f} s")
        left += sec
    ax.set_yticks([])
    ax.set_xlabel("seconds from the process's start")
    ax.set_title(f"where the run's time went ({left:.1f} s to the end of the export)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35))


def plot(steps: list[dict], slow: list[dict], out: Path, title: str = "", metrics: list[dict] | None = None,
         history: list[dict] | None = None, budget: list[tuple[str, float, str]] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["step"] for s in steps]
    y = [s["total"] * 1000 for s in steps]
    decoded = any("cer" in h for h in history or [])
    rows = (4 if decoded else 3) + (1 if budget else 0)
    heights = [1.3] + [1] * (rows - 1 - (1 if budget else 0)) + ([0.7] if budget else [])
    fig, axes = plt.subplots(rows, 2, figsize=(13, 4 * sum(heights) / 1.08), gridspec_kw={"height_ratios": heights})
    if decoded:
        plot_decoding(axes[3, 0], history)
        axes[3, 1].set_axis_off()
    if budget:  # the last row, both columns wide
        for a in axes[-1, :]:
            a.remove()
        plot_timeline(fig.add_subplot(axes[0, 0].get_gridspec()[-1, :]), budget)
    ax = axes[0, 0]
    ax.plot(x, y, lw=0.8, color="#444", label="step time")
    ax.plot(x, [v * 1000 for v in running_median([s["total"] for s in steps])], lw=1.5, color="#1f77b4",
            label="running median")
    by_step = {s["step"]: s for s in steps}
    for cause in sorted({s["cause"] for s in slow}):
        pts = [(s["step"], by_step[s["step"]]["total"] * 1000) for s in slow if s["cause"] == cause and s["step"] in by_step]
        if pts:
            ax.scatter(*zip(*pts), s=40, color=CAUSE_COLORS.get(cause, "k"), zorder=3, label=f"slow: {cause} ({len(pts)})")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("ms (log)")
    ax.set_title("every step")
    ax.legend(fontsize=8)

    ax = axes[0, 1]
    ax.hist(y, bins=40, color="#1f77b4")
    ax.set_xlabel("step time, ms")
    ax.set_ylabel("steps")
    ax.set_title("histogram")

    ax = axes[1, 0]
    bars = phase_bars(steps)
    labels, meds = [b[0] for b in bars], [b[1] * 1000 for b in bars]
    colors = {"data": "#1f77b4", "forward": "#ff7f0e", "backward": "#2ca02c", "optimizer": "#9467bd",
              "whole graphed step": "#9467bd", "between steps": "#7f7f7f"}
    ax.barh(labels, meds, color=[colors[x] for x in labels])
    for i, v in enumerate(meds):
        ax.text(v, i, f" {v:.1f}", va="center", fontsize=9)
    ax.set_xlabel("median ms")
    ax.set_title("phase breakdown (medians)")

    ax = axes[1, 1]
    if any("mem_peak_gb" in s for s in steps):
        ax.plot(x, [s.get("mem_peak_gb", 0) for s in steps], color="#d62728")
        ax.set_ylabel("peak allocated, GiB")
        ax.set_title("memory")
    else:
        ax.scatter([s["shape"]["tokens"] for s in steps], y, s=8, color="#2ca02c")
        ax.set_xlabel("LLM tokens in the batch")
        ax.set_ylabel("step time, ms")
        ax.set_title("step time vs tokens (CPU: no device memory)")
    metrics, history = metrics or [], history or []
    for ax, key, what in ((axes[2, 0], "loss", "loss"), (axes[2, 1], "acc", "accuracy")):
        if metrics:
            ax.plot([m["step"] for m in metrics], [m[key] for m in metrics], lw=0.8, color="#444", label=f"training {what}")
        if history:
            ax.plot([h["step"] for h in history], [h[key] for h in history], "o-", color="#d62728", label=f"validation {what}")
        ax.set_xlabel("step")
        ax.set_ylabel(what)
        ax.set_title(what + ("" if metrics or history else " (not recorded)"))
        if metrics or history:
            ax.legend(fontsize=8)
    fig.suptitle(title or "brisk step-time report", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def rank_records(run_dir: Path) -> dict[int, tuple[list[dict], list[dict]]]:
    """{rank: (step records, slow steps)}: rank 0 writes steps.jsonl, rank r > 0 steps.rank<r>.jsonl."""
    out = {0: (_read_jsonl(run_dir / "steps.jsonl"), _read_jsonl(run_dir / "slow_steps.jsonl"))}
    for path in sorted(run_dir.glob("steps.rank*.jsonl")):
        r = int(path.name[len("steps.rank"):-len(".jsonl")])
        out[r] = (_read_jsonl(path), _read_jsonl(run_dir / f"slow_steps.rank{r}.jsonl"))
    return out


def rank_lines(ranks: dict[int, tuple[list[dict], list[dict]]]) -> list[str]:
    """Markdown for a run of several ranks: each rank's numbers, and the job's step (the slowest rank's)."""
    lines = ["## Ranks", "", "| rank | steps | mean | median | p90 | slow steps | backward median | data median |",
             "|---|---|---|---|---|---|---|---|"]
    for r, (steps, slow) in sorted(ranks.items()):
        if not steps:
            lines.append(f"| {r} | 0 | | | | | | |")
            continue
        s = summarize(steps, slow)
        lines.append(f"| {r} | {s['steps']} | {s['mean'] * 1000:.1f} ms | {s['median'] * 1000:.1f} ms | "
                     f"{s['p90'] * 1000:.1f} ms | {s['slow']} | {s['phases']['backward'] * 1000:.1f} ms | "
                     f"{s['phases']['data'] * 1000:.1f} ms |")
    by_step: dict[int, dict[int, float]] = {}
    for r, (steps, _) in ranks.items():
        for x in steps:
            by_step.setdefault(x["step"], {})[r] = x["total"]
    common = [v for v in by_step.values() if len(v) == len(ranks)]
    if common:
        # The ranks meet at every gradient all-reduce, so the job advances at the slowest rank's pace.
        job = [max(v.values()) for v in common]
        spread = [max(v.values()) - min(v.values()) for v in common]
        slowest = [max(v, key=v.get) for v in common]
        count = {r: slowest.count(r) for r in sorted(ranks)}
        lines += ["", f"Job step (slowest rank each step, {len(common)} steps): mean {statistics.fmean(job) * 1000:.1f} ms, "
                  f"median {statistics.median(job) * 1000:.1f} ms; spread between ranks: median "
                  f"{statistics.median(spread) * 1000:.1f} ms, max {max(spread) * 1000:.1f} ms. Slowest rank: "
                  + ", ".join(f"rank {r} on {n} steps" for r, n in count.items()) + "."]
    return lines + [""]


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    ranks = rank_records(run_dir)
    steps, slow0 = ranks[0]
    slow = slow0
    if not steps:
        raise FileNotFoundError(f"{run_dir}: no steps.jsonl (is this a brisk run folder?)")
    if len(ranks) > 1:  # every rank's slow steps, tagged with the rank
        slow = sorted(({**x, "rank": r} for r, (_, sl) in ranks.items() for x in sl), key=lambda x: (x["step"], x["rank"]))
    accel = json.loads((run_dir / "accel.json").read_text()) if (run_dir / "accel.json").exists() else {}
    s = summarize(steps, slow0)
    title = f"{run_dir.name}: {accel.get('gpu', accel.get('device', ''))}, torch {accel.get('torch', '')}"
    history = _read_jsonl(run_dir / "history.jsonl")
    timeline = read_timeline(run_dir)
    budget = time_budget(steps, timeline) if timeline else None
    plot(steps, slow0, run_dir / "report.png", title, _read_jsonl(run_dir / "metrics.jsonl"), history, budget)
    gpu = any("mem_peak_gb" in x for x in steps)
    lines = [f"# Step-time report: {run_dir.name}", ""]
    if accel:
        lines += ["`" + one_line(accel) + "`", ""]
        if accel.get("plan_build_trap"):
            lines += [f"**Trap on this machine:** {accel['plan_build_trap']}", ""]
    lines += [
        "![step times](report.png)", "",
        "| steps | mean | median | p90 | slow steps | time lost to slow steps |" + (" peak memory |" if gpu else ""),
        "|---|---|---|---|---|---|" + ("---|" if gpu else ""),
        f"| {s['steps']} | {s['mean'] * 1000:.1f} ms | {s['median'] * 1000:.1f} ms | {s['p90'] * 1000:.1f} ms | "
        f"{s['slow']} | {s['slow_time']:.2f} s |" + (f" {s['mem_peak_gb']:.2f} GiB |" if gpu else ""), "",
        "Phase medians: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in phase_bars(steps)), "",
    ]
    if len(ranks) > 1:
        lines += rank_lines(ranks)
    if timeline:
        first = timeline["marks"].get("first step start")
        after = "" if any(sp["name"].startswith(("report", "export")) for sp in timeline["spans"]) else (
            " This report was written as the training ended: what came after it (an export, the report) is in the "
            "run's last log line, and `brisk report RUN` adds it here.")
        lines += ["## Where the run's time went", "",
                  f"From the {timeline['from']}"
                  + (f"; the first step started at {first:.1f} s" if first is not None else "") + "." + after, "",
                  "| phase | seconds | |", "|---|---|---|"]
        lines += [f"| {name} | {sec:.2f} | {note} |" for name, sec, note in budget]
        lines += [f"| total | {sum(sp['seconds'] for sp in timeline['spans']):.2f} | |", ""]
    if slow:
        lines += ["## Slow steps", "", "| step | time | x median | cause | why |", "|---|---|---|---|---|"]
        lines += [f"| {x['step']}{' (rank %d)' % x['rank'] if 'rank' in x else ''} | {x['total']:.3f} s | {x['ratio']:.1f} | "
                  f"{x['cause']} | {x['why']} |" for x in slow[:100]]
        if len(slow) > 100:
            lines.append(f"| ... | {len(slow) - 100} more | | | |")
        lines += ["", "Causes: " + ", ".join(f"{k} {v}" for k, v in s["causes"].items()), ""]
    else:
        lines += ["No slow steps.", ""]
    if history:
        dec = any("cer" in h for h in history)
        lines += ["## Validation", "", "| step | loss | accuracy |" + (" CER | WER |" if dec else ""),
                  "|---|---|---|" + ("---|---|" if dec else "")]
        cell = lambda h, k: f" {100 * h[k]:.2f}% |" if k in h else " |"  # noqa: E731
        lines += [f"| {h['step']} | {h['loss']:.4f} | {h['acc']:.4f} |" + (cell(h, "cer") + cell(h, "wer") if dec else "")
                  for h in history]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def console_summary(md: str, rows: int = 10) -> str:
    """The report's markdown for a terminal: no image link, at most ``rows`` slow-step rows."""
    out, in_slow, shown = [], False, 0
    for line in md.splitlines():
        if line.startswith("!["):
            continue
        if line.startswith("## "):
            in_slow = line == "## Slow steps"
        if in_slow and line.startswith("| ") and not line.startswith("| step |"):
            shown += 1
            if shown > rows:
                if shown == rows + 1:
                    out.append("| ... | (all of them in report.md) | | | |")
                continue
        out.append(line)
    return "\n".join(out).strip() + "\n"


if __name__ == "__main__":  # `python -m brisk.diagnose.report RUN`: what a training run starts at its end (no torch import)
    import sys

    print(write_report(sys.argv[1]))
