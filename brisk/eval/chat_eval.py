"""`brisk eval` for ``task: chat``: validation loss, perplexity and next-token accuracy over the assistant tokens
(the training labels: the same template, the same max_len rule), and a few greedy answers beside the
references with the rate of those equal to their reference (exact match). Perplexity is exp of the token-weighted mean cross-entropy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..config import Config
from ..data.chat import build_chat_dataset, read_chat_jsonl, training_template
from ..data.collate import Collator
from ..models.speech_llm import lm_loss


@torch.no_grad()
def chat_loss(model, dataset, device, batch_size: int = 8) -> dict:
    collate = Collator()
    total, correct, count = 0.0, 0, 0
    for s in range(0, len(dataset), batch_size):
        batch = collate([dataset[i] for i in range(s, min(s + batch_size, len(dataset)))]).to(device)
        loss, ok, n = lm_loss(model(batch), batch.labels)
        total += float(loss) * int(n)
        correct, count = correct + int(ok), count + int(n)
    mean = total / max(count, 1)
    return {"conversations": len(dataset), "label_tokens": count, "loss": mean, "perplexity": math.exp(min(mean, 700)),
            "accuracy": correct / max(count, 1)}


@torch.no_grad()
def greedy_answers(model, tokenizer, path: str, n: int, device, max_new_tokens: int, template: str | None = None) -> list[dict]:
    """The first ``n`` conversations: everything before their last assistant turn, answered greedily.

    ``template``: the chat template training rendered the conversations with (its training twin). The model's
    own Qwen3 template renders earlier assistant turns without the empty thinking block the twin put in every
    turn, a history the model never saw in training; the twin renders it as trained."""
    convs, _ = read_chat_jsonl(path, skip_bad=True)
    rows = []
    for conv in convs[:n]:
        last = max(i for i, m in enumerate(conv.messages) if m["role"] == "assistant")
        prompt = tokenizer.apply_chat_template(conv.messages[:last], add_generation_prompt=True, tokenize=True,
                                               return_dict=True, return_tensors="pt", chat_template=template)
        ids = prompt["input_ids"].to(device)
        out = model.llm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        rows.append({"key": conv.key, "user": conv.messages[last - 1]["content"],
                     "reference": conv.messages[last]["content"], "answer": answer.strip()})
    return rows


def exact_match_rate(rows: list[dict]) -> dict:
    """Greedy answers equal to their reference (both stripped of surrounding white space); marks each row. Teacher-
    forced accuracy scores each next token given the right ones before it; one wrong token makes an answer wrong."""
    for row in rows:
        row["exact"] = row["answer"].strip() == row["reference"].strip()
    exact = sum(r["exact"] for r in rows)
    return {"answered": len(rows), "exact": exact, "exact_match": exact / max(len(rows), 1)}


def chat_eval_main(args, cfg: Config, model, tokenizer, weights, device) -> int:
    d = cfg.data
    dataset, _ = build_chat_dataset(args.data, tokenizer, max_len=d.max_len, overlong=d.overlong, skip_bad=d.skip_bad,
                                    template_path=d.chat_template)
    s = chat_loss(model, dataset, device, args.batch_size)
    template = training_template(tokenizer, d.chat_template)
    answers = greedy_answers(model, tokenizer, args.data, args.answers, device, min(args.max_new_tokens, 256), template)
    s.update(exact_match_rate(answers))
    out = Path(args.out) if args.out else (Path(args.model) / "eval" / f"{Path(args.data).stem}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in answers:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    out.with_suffix(".summary.json").write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    print(f"model: {args.model} (weights {weights}); data: {args.data}")
    print("| conversations | assistant tokens | loss | perplexity | accuracy | exact match |")
    print("|---|---|---|---|---|---|")
    print(f"| {s['conversations']} | {s['label_tokens']} | {s['loss']:.4f} | {s['perplexity']:.3f} | {s['accuracy']:.3f} | "
          f"{s['exact']}/{s['answered']} ({100 * s['exact_match']:.1f}%) |")
    for row in answers:
        print(f"  {row['key']}  user: {row['user']!r}")
        print(f"  {' ' * len(row['key'])}  ref:  {row['reference']!r}")
        print(f"  {' ' * len(row['key'])}  greedy: {row['answer']!r}")
    print(f"greedy answers: {out}")
    return 0
