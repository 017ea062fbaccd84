"""`brisk eval` on a chat run reads its data as training reads it (brisk.data.chat_store through the family's
prepare): a parquet file scores as its jsonl does, and prompt/completion rows are answered from their prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brisk.cli import main

ROOT = Path(__file__).resolve().parents[1]
VALID = ROOT / "data" / "chat_demo" / "valid.jsonl"


def _summary(capsys) -> tuple[list[str], list[str]]:
    out = capsys.readouterr().out.splitlines()
    table = next(x for x in out if x.startswith("| ") and x[2].isdigit()).split("|")[1:-1]
    return [c.strip() for c in table], out


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("chat") / "run"
    assert main(["train", "sft_demo", f"train.output_dir={run}", "train.max_steps=4", "diagnose.report=false",
                 "train.tensorboard=false", "train.export=none"]) == 0
    return run


def test_eval_of_a_chat_run_on_parquet_scores_as_on_jsonl(chat_run, tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(x) for x in VALID.read_text(encoding="utf-8").splitlines() if x.strip()]
    parquet = tmp_path / "valid.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": r["messages"]} for r in rows]), parquet)
    capsys.readouterr()
    assert main(["eval", str(chat_run), str(VALID), "--answers", "1", "--max-new-tokens", "4",
                 "--out", str(tmp_path / "a.jsonl")]) == 0
    from_jsonl, _ = _summary(capsys)
    assert main(["eval", str(chat_run), str(parquet), "--answers", "1", "--max-new-tokens", "4",
                 "--out", str(tmp_path / "b.jsonl")]) == 0
    from_parquet, out = _summary(capsys)
    # conversations, assistant tokens, loss, perplexity, accuracy: the same rows give the same numbers
    assert from_parquet[:5] == from_jsonl[:5] and int(from_parquet[0]) == len(rows), (from_jsonl, from_parquet)
    assert sum("greedy:" in x for x in out) == 1


def test_eval_of_a_chat_run_on_prompt_completion_rows(chat_run, tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(x) for x in VALID.read_text(encoding="utf-8").splitlines() if x.strip()][:6]
    split = [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in rows]
    parquet = tmp_path / "pc.parquet"
    pq.write_table(pa.Table.from_pylist(split), parquet)
    capsys.readouterr()
    assert main(["eval", str(chat_run), str(parquet), "--answers", "2", "--max-new-tokens", "4",
                 "--out", str(tmp_path / "pc.jsonl")]) == 0
    table, _ = _summary(capsys)
    assert int(table[0]) == 6 and int(table[1]) > 0
    answered = [json.loads(x) for x in (tmp_path / "pc.jsonl").read_text().splitlines()]
    assert [a["reference"] for a in answered] == [r["messages"][-1]["content"] for r in rows[:2]]
