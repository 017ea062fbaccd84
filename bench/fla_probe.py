"""Does a Qwen3.5 model train the same with fla's kernels as with the batched torch path? A few optimizer steps
of the same model (random init, same seed), the same packed batches (data/chat_demo), one process an arm,
per-step loss, gradient norm and parameter norm written as JSON; then the comparison.

    python bench/fla_probe.py --arm fla --out /tmp/p          # fla-core importable (brisk's fla path)
    python bench/fla_probe.py --arm batched --out /tmp/p      # fla NOT importable: transformers' torch layer, batched
    python bench/fla_probe.py --arm batched_fp32 --out /tmp/p # the same in fp32: the bf16 noise the tolerance is set from
    python bench/fla_probe.py --compare /tmp/p                # table; exit 1 when fla's gap exceeds the tolerance

The tolerance is calibrated per step: fla's distance from the fp32 run may be at most 4 times the batched bf16
run's own distance from it (its bf16 noise), plus 1e-3 relative (steps where the bf16 noise is by chance tiny).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARMS = ("fla", "batched", "batched_fp32")


def run(arm: str, out: Path, steps: int, config: str, layers: int, device: str = "cuda", extra=()) -> None:
    sys.path.insert(0, str(REPO))
    import torch
    from transformers import AutoTokenizer

    from brisk.config import load_config
    from brisk.data.chat_store import build_chat_store
    from brisk.data.collate import Collator
    from brisk.models.build import build_model
    from brisk.models.lm import lm_loss
    from brisk.speed import llm_kernels as K

    dtype = "fp32" if arm == "batched_fp32" else "bf16"
    cfg = load_config(REPO / config, [f"model.llm.dtype={dtype}", f"model.llm.config.num_hidden_layers={layers}",
                                      "model.llm.config.vocab_size=4096", *extra])
    if ("fla" in sys.modules or K.available("fla")) != (arm == "fla"):
        raise SystemExit(f"arm {arm}: flash-linear-attention must {'' if arm == 'fla' else 'not '}be importable")
    torch.manual_seed(0)
    model = build_model(cfg, device)
    note = K.apply_fla_linear_attention(model) if arm == "fla" else K.apply_linear_attention_batched(model)
    tok = AutoTokenizer.from_pretrained(str(REPO / "data/chat_demo/tokenizer"), local_files_only=True)
    ds = build_chat_store(str(REPO / "data/chat_demo/train.jsonl"), tok, max_len=1024, overlong="truncate",
                          skip_bad=False, cache_dir=out / ".brisk-cache")
    collate = Collator(packed=True, token_buckets=(4096,))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5)
    records = []
    for step in range(steps):
        batch = collate([ds[(step * 16 + i) % len(ds)] for i in range(16)]).to(device)
        loss = lm_loss(model(batch), batch.labels)[0]
        loss.backward()
        grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
        grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        opt.step()
        opt.zero_grad(set_to_none=True)
        param_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.float()) for p in model.parameters()]))
        records.append({"step": step, "loss": loss.item(), "grad_norm": grad_norm.item(), "param_norm": param_norm.item(),
                        "tokens": int(batch.input_ids.numel())})
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{arm}.json").write_text(json.dumps({"arm": arm, "note": note, "records": records}, indent=1))
    print(arm, note, json.dumps(records[-1]))


def compare(out: Path) -> int:
    r = {a: json.loads((out / f"{a}.json").read_text())["records"] for a in ARMS}
    lines = ["| step | metric | fp32 batched | bf16 batched | bf16 fla | batched gap | fla gap | tolerance | within |",
             "|---|---|---|---|---|---|---|---|---|"]
    bad = 0
    for i, ref in enumerate(r["batched_fp32"]):
        for m in ("loss", "grad_norm", "param_norm"):
            want, noise, got = ref[m], r["batched"][i][m], r["fla"][i][m]
            gap_noise, gap = abs(noise - want) / abs(want), abs(got - want) / abs(want)
            tol = 4 * gap_noise + 1e-3
            ok = gap <= tol
            bad += not ok
            lines.append(f"| {i} | {m} | {want:.6g} | {noise:.6g} | {got:.6g} | {gap_noise:.2e} | {gap:.2e} | {tol:.2e} | "
                         f"{'yes' if ok else '**NO**'} |")
    text = "\n".join(lines) + "\n"
    (out / "fla_probe.md").write_text(text)
    print(text)
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", choices=ARMS)
    ap.add_argument("--compare", type=Path)
    ap.add_argument("--out", type=Path, default=Path("/tmp/fla_probe"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--config", default="configs/sft_qwen3_5_2b.yaml")
    ap.add_argument("--set", nargs="*", default=[], help="more config overrides (key=value)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the torch arms")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (the 2B config's shapes, fewer layers)")
    args = ap.parse_args()
    if args.compare:
        raise SystemExit(compare(args.compare))
    run(args.arm, args.out, args.steps, args.config, args.layers, args.device, args.set)


if __name__ == "__main__":
    main()
