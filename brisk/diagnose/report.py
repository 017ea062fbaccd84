"""`brisk report RUN`: the step-time picture of a run, as report.png and report.md in the run folder.

Panels: every step's time with slow steps marked by cause and the running median; a histogram; the median
phase breakdown (data, forward, backward, optimizer, between-step work); memory (peak allocated per step on
a GPU, tokens per step on the CPU); with a validation history, its loss and accuracy curves and, where the
run decoded (train.val_decode), CER and WER. The markdown holds the acceleration state, summary numbers, the slow
steps with their causes, and the validation history.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

CAUSE_COLORS = {"plan_build": "#d62728", "new_shape": "#ff7f0e", "recompile": "#9467bd", "data": "#1f77b4",
                "checkpoint": "#2ca02c", "validation": "#17becf", "gc": "#8c564b", "unknown": "#7f7f7f"}


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


def plot_history(ax_loss, ax_err, history: list[dict]) -> None:
    """Validation curves: loss and accuracy; CER and WER where the run decoded (train.val_decode)."""
    x = [h["step"] for h in history]
    ax_loss.plot(x, [h["loss"] for h in history], "o-", color="#d62728", label="loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("validation loss")
    ax_loss.set_title("validation loss and token accuracy")
    acc = ax_loss.twinx()
    acc.plot(x, [h["acc"] for h in history], "s--", color="#2ca02c", label="accuracy")
    acc.set_ylabel("token accuracy")
    dec = [h for h in history if "cer" in h]
    if dec:
        xs = [h["step"] for h in dec]
        ax_err.plot(xs, [100 * h["cer"] for h in dec], "o-", color="#1f77b4", label="CER")
        ax_err.plot(xs, [100 * h["wer"] for h in dec], "s--", color="#ff7f0e", label="WER")
        ax_err.set_ylabel("%")
        ax_err.legend(fontsize=8)
        ax_err.set_title(f"validation CER / WER (greedy, {dec[-1].get('decoded', '?')} utterances)")
    else:
        ax_err.text(0.5, 0.5, "no decoding (train.val_decode=0)", ha="center", va="center", transform=ax_err.transAxes)
        ax_err.set_axis_off()
    ax_err.set_xlabel("step")


def plot(steps: list[dict], slow: list[dict], out: Path, title: str = "", history: list[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["step"] for s in steps]
    y = [s["total"] * 1000 for s in steps]
    if history:
        fig, axes = plt.subplots(3, 2, figsize=(13, 12.5), gridspec_kw={"height_ratios": [1.3, 1, 1]})
        plot_history(axes[2, 0], axes[2, 1], history)
    else:
        fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), gridspec_kw={"height_ratios": [1.3, 1]})
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
    phases = ["data", "forward", "backward", "optimizer"]
    meds = [statistics.median([s[p] for s in steps]) * 1000 for p in phases]
    other = statistics.median([max(0.0, s["total"] - sum(s[p] for p in phases)) for s in steps]) * 1000
    ax.barh(phases + ["between steps"], meds + [other], color=["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#7f7f7f"])
    for i, v in enumerate(meds + [other]):
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
    fig.suptitle(title or "brisk step-time report", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    steps = _read_jsonl(run_dir / "steps.jsonl")
    if not steps:
        raise FileNotFoundError(f"{run_dir}: no steps.jsonl (is this a brisk run folder?)")
    slow = _read_jsonl(run_dir / "slow_steps.jsonl")
    accel = json.loads((run_dir / "accel.json").read_text()) if (run_dir / "accel.json").exists() else {}
    s = summarize(steps, slow)
    title = f"{run_dir.name}: {accel.get('gpu', accel.get('device', ''))}, torch {accel.get('torch', '')}"
    history = _read_jsonl(run_dir / "history.jsonl")
    plot(steps, slow, run_dir / "report.png", title, history)
    lines = [f"# Step-time report: {run_dir.name}", ""]
    if accel:
        from .accel import one_line

        lines += ["`" + one_line(accel) + "`", ""]
        if accel.get("plan_build_trap"):
            lines += [f"**Trap on this machine:** {accel['plan_build_trap']}", ""]
    lines += [
        "![step times](report.png)", "",
        "| steps | mean | median | p90 | slow steps | time lost to slow steps | peak memory |",
        "|---|---|---|---|---|---|---|",
        f"| {s['steps']} | {s['mean'] * 1000:.1f} ms | {s['median'] * 1000:.1f} ms | {s['p90'] * 1000:.1f} ms | "
        f"{s['slow']} | {s['slow_time']:.2f} s | {s['mem_peak_gb']:.2f} GiB |", "",
        "Phase medians: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in s["phases"].items()), "",
    ]
    if slow:
        lines += ["## Slow steps", "", "| step | time | x median | cause | why |", "|---|---|---|---|---|"]
        lines += [f"| {x['step']} | {x['total']:.3f} s | {x['ratio']:.1f} | {x['cause']} | {x['why']} |" for x in slow[:100]]
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
