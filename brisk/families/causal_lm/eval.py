"""`brisk eval` for ``model.family: causal_lm``: validation loss, perplexity and next-token accuracy over the labelled tokens,
and a few greedy answers beside the references with the rate of those equal to their reference (exact match).
Perplexity is exp of the token-weighted mean cross-entropy.

The data is read as training reads it (the family's ``prepare``, brisk.data.chat_store): any layout (jsonl,
parquet, a datasets folder and its data.valid_split), the messages or prompt/completion format, the same
template, labels and max_len rule, and the same token cache."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ...config import Config
from ...data.chat import training_template
from ...data.chat_store import completion_template, read_rows
from ..registry import section
from .data import chat_prepare
from ...data.collate import Collator
from ...models.lm import lm_loss


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
def greedy_answers(model, tokenizer, rows: list[tuple], device, max_new_tokens: int, template: str | None = None,
                   plain: str | None = None) -> list[dict]:
    """``rows`` (chat_store.read_rows: key, messages, completion) answered greedily: a conversation's turns before
    its last assistant turn, or a prompt/completion row's prompt.

    Each is rendered with the template training labelled it with: ``template``, the training twin, for a
    conversation (the model's own Qwen3 template renders earlier assistant turns without the empty thinking block
    the twin put in every turn, a history the model never saw in training); ``plain``, the tokenizer's own (or
    causal_lm.chat_template), for a prompt, as TRL's prompt/completion labelling renders it."""
    out = []
    for key, messages, completion in rows:
        if completion is None:
            last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            prompt_turns, reference, chat_template = messages[:last], messages[last]["content"], template
        else:
            prompt_turns, chat_template = messages, plain
            reference = "\n".join(m["content"] for m in completion if m["role"] == "assistant")
        prompt = tokenizer.apply_chat_template(prompt_turns, add_generation_prompt=True, tokenize=True,
                                               return_dict=True, return_tensors="pt", chat_template=chat_template)
        ids = prompt["input_ids"].to(device)
        gen = model.llm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        answer = tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
        out.append({"key": key, "user": prompt_turns[-1]["content"], "reference": reference, "answer": answer.strip()})
    return out


def exact_match_rate(rows: list[dict]) -> dict:
    """Greedy answers equal to their reference (both stripped of surrounding white space); marks each row. Teacher-
    forced accuracy scores each next token given the right ones before it; one wrong token makes an answer wrong."""
    for row in rows:
        row["exact"] = row["answer"].strip() == row["reference"].strip()
    exact = sum(r["exact"] for r in rows)
    return {"answered": len(rows), "exact": exact, "exact_match": exact / max(len(rows), 1)}


def chat_eval_main(args, cfg: Config, model, tokenizer, weights, device) -> int:
    d = cfg.data
    dataset = chat_prepare(cfg, "valid", args.data, tokenizer)  # as training reads data.valid
    s = chat_loss(model, dataset, device, args.batch_size)
    rows = read_rows(args.data, d.valid_split, "the eval data", args.answers) if args.answers else []
    plain = completion_template(tokenizer, section(cfg).chat_template) if any(c is not None for *_, c in rows) else None
    answers = greedy_answers(model, tokenizer, rows, device, min(args.max_new_tokens, 256),
                             training_template(tokenizer, section(cfg).chat_template), plain)
    s.update(exact_match_rate(answers))
    out = Path(args.out) if args.out else (Path(args.model) / "eval" / f"{Path(args.data).stem}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in answers:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    out.with_suffix(".summary.json").write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    print(f"model: {args.model}; weights: {weights or args.model}; data: {args.data}")
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
