"""`brisk probe compare A B` and `brisk probe calibrate A B [C ...]`.

compare: every checkpoint of B against A's under the tolerance of its metric; a summary table (what was
recorded, max and mean difference, tolerance, met or unmet with counts), the worst offenders, and exit
status 1 when any gate is unmet. A checkpoint present in one record only is unmet ("missing").

calibrate: records of the same configuration that differ only in harmless ways (another seed for the
GPU's own nondeterminism, an equivalent attention kernel) give the spread the numbers have anyway; the
proposed tolerance of each metric is ``margin`` x the largest difference seen against the first record,
so a gate can say "within run-to-run noise".
"""

from __future__ import annotations

import fnmatch
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_TOLERANCES = Path(__file__).with_name("tolerances.yaml")


def record_path(p: str | Path) -> Path:
    p = Path(p)
    if p.is_dir():
        p = p / "probe.rank0.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no probe record (run with probe.enabled=true)")
    return p


def load_record(p: str | Path) -> dict[tuple[str, int], float]:
    out = {}
    with record_path(p).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            obj = json.loads(line)
            if "metric" in obj:
                out[(obj["metric"], int(obj["step"]))] = float(obj["value"])
            elif n == 1 and obj.get("probe") != 1:
                raise ValueError(f"{p}: not a brisk probe record")
    return out


def shipped_tolerances() -> dict[str, Path]:
    """The tolerance files in the package by name: default (the declared gates) and tolerances_<name>.yaml."""
    out = {"default": DEFAULT_TOLERANCES}
    for p in sorted(DEFAULT_TOLERANCES.parent.glob("tolerances_*.yaml")):
        out[p.stem.removeprefix("tolerances_")] = p
    return out


def load_tolerances(path: str | Path | None) -> dict[str, dict]:
    """``path``: a YAML file, or the name of a shipped one (default, kernel_noise), or None for the default."""
    shipped = shipped_tolerances()
    if path is None:
        path = shipped["default"]
    elif not Path(path).is_file() and str(path) in shipped:  # a file of that name, if there is one, comes first
        path = shipped[str(path)]
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--tolerances {path}: no such file, and not a shipped name ({', '.join(shipped)})")
    rules = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for k, rule in rules.items():
        if not isinstance(rule, dict) or not ({"abs", "rel", "exact", "frac"} & set(rule)):
            raise ValueError(f"{path}: tolerance for {k!r} needs abs, rel, frac (with frac_of) or exact")
    return rules


def rule_for(metric: str, rules: dict) -> tuple[str, dict] | None:
    if metric in rules:
        return metric, rules[metric]
    for pattern, rule in rules.items():
        if fnmatch.fnmatchcase(metric, pattern):
            return pattern, rule
    return None


def allowed(rule: dict, ref: float, step: int, a: dict) -> float:
    if rule.get("exact"):
        return 0.0
    if "frac" in rule:
        return rule["frac"] * abs(a.get((rule["frac_of"], step), 0.0))
    bound = 0.0
    if "abs" in rule:
        bound = max(bound, rule["abs"])
    if "rel" in rule:
        bound = max(bound, rule["rel"] * abs(ref))
    return bound


def describe(rule: dict) -> str:
    if rule.get("exact"):
        return "exact"
    if "frac" in rule:
        return f"{rule['frac']:.3g} x {rule['frac_of']}"
    parts = []
    if "abs" in rule:
        parts.append(f"{rule['abs']:.3g} abs")
    if "rel" in rule:
        parts.append(f"{rule['rel']:.3g} rel")
    return " or ".join(parts)


@dataclass
class Check:
    metric: str
    step: int
    a: float | None
    b: float | None
    diff: float
    bound: float

    @property
    def met(self) -> bool:
        return self.a is not None and self.b is not None and math.isfinite(self.diff) and self.diff <= self.bound

    @property
    def severity(self) -> float:
        if self.a is None or self.b is None or not math.isfinite(self.diff):
            return math.inf
        return self.diff / self.bound if self.bound > 0 else (math.inf if self.diff > 0 else 0.0)


def family(metric: str) -> str:
    if metric.startswith("grad_norm."):
        return "grad_norm.<module>"
    if metric.startswith("batch."):
        return "batch shapes (utts, tokens, speech frames)"
    return metric


def compare(a: dict, b: dict, rules: dict) -> list[Check]:
    checks = []
    for key in sorted(set(a) | set(b), key=lambda k: (k[0], k[1])):
        metric, step = key
        found = rule_for(metric, rules)
        if found is None:
            continue  # recorded but not gated
        va, vb = a.get(key), b.get(key)
        diff = abs(va - vb) if va is not None and vb is not None else math.inf
        checks.append(Check(metric, step, va, vb, diff, allowed(found[1], va if va is not None else 0.0, step, a)))
    return checks


def ungated(a: dict, b: dict, rules: dict) -> list[str]:
    """Metrics the records hold that no rule gates (said under the table, so a missing rule is not silent)."""
    return sorted({m for m, _ in set(a) | set(b) if rule_for(m, rules) is None})


def render(checks: list[Check], rules: dict, name_a: str, name_b: str, worst: int = 10,
           not_gated: list[str] = ()) -> str:
    fams: dict[str, list[Check]] = {}
    for c in checks:
        fams.setdefault(family(c.metric), []).append(c)
    unmet_total = sum(1 for c in checks if not c.met)
    lines = [f"Probe: {name_b} against {name_a}: {len(checks)} checkpoints, "
             f"{len(checks) - unmet_total} within tolerance, {unmet_total} not.", "",
             "| recorded | checkpoints | max diff | mean diff | tolerance | gate |", "|---|---|---|---|---|---|"]
    for fam, cs in fams.items():
        finite = [c.diff for c in cs if math.isfinite(c.diff)]
        unmet = [c for c in cs if not c.met]
        rule = rule_for(cs[0].metric, rules)[1]
        gate = "met" if not unmet else f"unmet on {len(unmet)} of {len(cs)}"
        lines.append(f"| {fam} | {len(cs)} | {max(finite) if finite else float('nan'):.4g} | "
                     f"{statistics.fmean(finite) if finite else float('nan'):.4g} | {describe(rule)} | {gate} |")
    bad = sorted((c for c in checks if not c.met), key=lambda c: -c.severity)[:worst]
    if bad:
        lines += ["", "Worst offenders:", "", "| metric | step | reference | this run | diff | allowed |", "|---|---|---|---|---|---|"]
        for c in bad:
            fmt = lambda v: "missing" if v is None else f"{v:.6g}"  # noqa: E731
            lines.append(f"| {c.metric} | {c.step} | {fmt(c.a)} | {fmt(c.b)} | {c.diff:.4g} | {c.bound:.4g} |")
    if not_gated:
        lines += ["", "Recorded but not gated (no rule for them in these tolerances): " + ", ".join(not_gated)]
    return "\n".join(lines) + "\n"


def compare_main(a: str, b: str, tolerances: str | None, out: str | None) -> int:
    rules = load_tolerances(tolerances)
    ra, rb = load_record(a), load_record(b)
    checks = compare(ra, rb, rules)
    if not checks:
        raise ValueError("no gated checkpoints in common: are these probe records of the same kind of run?")
    text = render(checks, rules, str(a), str(b), not_gated=ungated(ra, rb, rules))
    print(text)
    if out:
        Path(out).write_text(text, encoding="utf-8")
    return 0 if all(c.met for c in checks) else 1


def calibrate(records: list[dict], rules: dict, margin: float) -> dict[str, dict]:
    """Proposed rules: margin x the largest spread against the first record, in each rule's own terms.

    Only checkpoints present in both records count; a record sharing none with the first is an error
    (a crashed run would otherwise look like a perfect match).
    """
    ref = records[0]
    for i, other in enumerate(records[1:], 2):
        if not set(ref) & set(other):
            raise ValueError(f"record {i} shares no checkpoint with record 1 (did that run fail?)")
    by_pattern: dict[str, list] = {}
    for k in ref:
        found = rule_for(k[0], rules)
        if found:
            by_pattern.setdefault(found[0], []).append(k)
    proposed: dict[str, dict] = {}
    for pattern, rule in rules.items():
        keys = by_pattern.get(pattern, [])
        worst_abs = worst_rel = worst_frac = 0.0
        compared = 0
        for other in records[1:]:
            for k in keys:
                if k not in other:
                    continue
                compared += 1
                d = abs(ref[k] - other[k])
                worst_abs = max(worst_abs, d)
                if ref[k]:
                    worst_rel = max(worst_rel, d / abs(ref[k]))
                if "frac" in rule:
                    base = abs(ref.get((rule["frac_of"], k[1]), 0.0))
                    if base:
                        worst_frac = max(worst_frac, d / base)
        if not compared:
            continue
        if rule.get("exact"):
            new = {"exact": True} if worst_abs == 0 else {"abs": margin * worst_abs}
        elif "frac" in rule:
            new = {"frac_of": rule["frac_of"], "frac": float(f"{max(margin * worst_frac, 1e-9):.3g}")}
        elif "rel" in rule:
            new = {"rel": float(f"{max(margin * worst_rel, 1e-9):.3g}")}
        else:
            new = {"abs": float(f"{max(margin * worst_abs, 1e-12):.3g}")}
        new["observed"] = {"max_abs": worst_abs, "max_rel": worst_rel, "checkpoints": compared, "pairs": len(records) - 1}
        proposed[pattern] = new
    return proposed


# Keys that cannot change the numbers a probe records: speed switches (what the probe judges), where
# things are written, how often metrics are read, and the bookkeeping of runs.
HARMLESS = ("speed.*", "train.output_dir", "train.resume", "train.resume_from", "train.overwrite", "train.progress",
            "train.tensorboard", "train.log_every", "train.max_steps", "train.max_epochs", "train.val_every", "train.save_every", "train.keep_n", "train.keep_metric",
            "train.export", "train.export_dtype", "train.save_final", "train.gc_every", "data.num_workers", "data.pin_memory",
            "diagnose.*", "probe.*", "bench.*")


def record_config(p: str | Path) -> dict:
    with record_path(p).open(encoding="utf-8") as f:
        head = json.loads(f.readline() or "{}")
    return head.get("config") or {}


def config_differences(configs: list[dict]) -> list[str]:
    """'key: a -> b (record i)' for keys that differ from the first record's and may change the numbers."""
    from ..config import config_changes

    out = []
    for i, other in enumerate(configs[1:], 2):
        for change in config_changes(configs[0], other, ignore=set()):
            key = change.split(":", 1)[0]
            if not any(fnmatch.fnmatchcase(key, pat) for pat in HARMLESS):
                out.append(f"{change} (record {i})")
    return out


def spread_warnings(proposed: dict) -> list[str]:
    zero = [k for k, v in proposed.items() if v["observed"]["max_abs"] == 0]
    if not zero:
        return []
    which = "every metric" if len(zero) == len(proposed) else ", ".join(zero)
    return [f"warning: zero spread in {which}: the records are identical, so the proposed gates are exact; "
            "calibrate from runs that differ in a harmless way (another GPU run, an equivalent kernel)"]


def calibrate_main(paths: list[str], out: str | None, margin: float, allow_config_diff: bool = False) -> int:
    rules = load_tolerances(None)
    diffs = config_differences([record_config(p) for p in paths])
    if diffs:
        shown = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        if not allow_config_diff:
            raise ValueError(f"the records' configs differ in keys that change the numbers ({shown}): their spread "
                             "is not run-to-run noise; calibrate from equivalent runs, or pass --allow-config-diff")
        print(f"WARNING: the records' configs differ in keys that change the numbers ({shown}); the proposed "
              "tolerances include that difference", file=sys.stderr)
    proposed = calibrate([load_record(p) for p in paths], rules, margin)
    for w in spread_warnings(proposed):
        print(w, file=sys.stderr)
    header = (f"# Proposed by `brisk probe calibrate` from {len(paths)} records ({', '.join(map(str, paths))}),\n"
              f"# margin {margin} x the largest difference against the first. 'observed' is informational.\n")
    text = header + yaml.safe_dump(proposed, sort_keys=False)
    if out:
        Path(out).write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0
