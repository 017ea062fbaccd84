"""train.val_decode: greedy-decode the first N validation utterances at each validation (rank 0).

Kept cheap: N utterances only, decoded in batches of 8, at most 2 x the longest reference (in tokens) + 8
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
from ..eval.evaluate import score


class ValDecoder:
    def __init__(self, valid, run_dir: Path, n: int, device: torch.device, fast: bool = False, *, recognizer):
        """``recognizer``: the model family's (model, valid dataset, device, fast) -> Recognizer."""
        self.valid, self.run_dir, self.n, self.device, self.fast = valid, run_dir, n, device, fast
        self.make = recognizer
        self.rec: Recognizer | None = None
        self.last_rows: list[dict] = []
        if valid is not None:
            utts = valid.dataset.utts[:n]
            self.keys = [u.key for u in utts]
            self.paths = [u.audio_paths()[0] for u in utts]
            self.refs = [u.assistant[0] for u in utts]

    def run(self, model, step: int) -> dict:
        if self.valid is None:
            return {}
        ds = self.valid.dataset
        if self.rec is None:
            self.rec = self.make(model, ds, self.device, self.fast)
            self.max_new = 2 * max(len(self.rec.tok.encode(r)) for r in self.refs) + 8
        t0 = time.perf_counter()
        try:
            results = self.rec.transcribe(self.paths, batch_size=8, max_new_tokens=self.max_new)
        finally:
            self.rec.release()
        seconds = time.perf_counter() - t0
        rows, summary = score(self.keys, self.refs, [r.text for r in results])
        self.last_rows = rows
        with (self.run_dir / "valid_decode.jsonl").open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}, ensure_ascii=False) + "\n")
        return {"cer": summary["cer"], "wer": summary["wer"], "decoded": len(rows), "decode_seconds": seconds}
