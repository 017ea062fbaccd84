"""train.val_decode: greedy-decode the first N validation utterances at each validation (rank 0).

Kept cheap: N utterances only, decoded in length-sorted batches of 8 (brisk.eval.testset, as `brisk eval` does), at most 2 x the longest reference (in tokens) + 8
new tokens each, so an untrained model that never emits <|im_end|> cannot run to FunASR's 512. Each
validation appends its transcripts (with the step) to valid_decode.jsonl in the run folder.

With train.val_decode_fast the fast decoder (brisk/eval/fast_decode.py) decodes; its caches, buffers and CUDA
graphs (captured in a memory pool of their own, apart from the training step's graphs) are given back after
each validation, so training keeps its memory between validations.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..eval.decode import Recognizer
from ..eval.evaluate import score, summarize
from ..eval.testset import Item, run_items


class ValDecoder:
    def __init__(self, valid, run_dir: Path, n: int, device: torch.device, fast: bool = False, *, recognizer):
        """``recognizer``: the model family's (model, valid dataset, device, fast) -> Recognizer."""
        self.valid, self.run_dir, self.n, self.device, self.fast = valid, run_dir, n, device, fast
        self.make = recognizer
        self.rec: Recognizer | None = None
        self.last_rows: list[dict] = []
        if valid is not None:
            utts = valid.dataset.utts[:n]
            self.items = [Item(i, u.key, u.audio_paths()[0], u.assistant[0], u.speech_length / 100)
                          for i, u in enumerate(utts)]
            self.refs = [it.ref for it in self.items]

    def run(self, model, step: int, tag: str | None = None) -> dict:
        if self.valid is None:
            return {}
        ds = self.valid.dataset
        if self.rec is None:
            self.rec = self.make(model, ds, self.device, self.fast)
            self.max_new = 2 * max(len(self.rec.tok.encode(r)) for r in self.refs) + 8
        t0 = time.perf_counter()
        try:  # the path `brisk eval` takes: length-sorted batches, rows back in input order
            rows, _ = run_items(self.rec, self.items, None, lambda it, r: score([it.key], [it.ref], [r.text])[0][0],
                                batch_size=8, max_new_tokens=self.max_new)
        finally:
            self.rec.release()
        seconds = time.perf_counter() - t0
        rows = [{k: v for k, v in row.items() if k != "index"} for row in rows]
        summary = summarize(rows)
        self.last_rows = rows
        with (self.run_dir / "valid_decode.jsonl").open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **({"weights": tag} if tag else {}), **row}, ensure_ascii=False) + "\n")
        return {"cer": summary["cer"], "wer": summary["wer"], "decoded": len(rows), "decode_seconds": seconds}
