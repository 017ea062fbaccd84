"""Regenerate the table of docs/troubleshooting.md: every bad input we tried, run through the real `brisk`
command (in process, tiny models, the bundled demo data), and the exact line it printed.

    python tools/troubleshooting_table.py > /tmp/table.md

Temporary paths print as <tmp>, the checkout as <repo>. Takes a few minutes on 2 cores (it trains tiny runs).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brisk.cli import main  # noqa: E402

DEMO = REPO / "configs" / "demo.yaml"
DATA = REPO / "data" / "demo"
TINY = ["model.encoder.output_size=32", "model.encoder.linear_units=64", "model.encoder.num_blocks=2",
        "model.encoder.tp_blocks=1", "model.adaptor.ffn_dim=64", "model.adaptor.n_layer=1",
        "model.llm.config.hidden_size=32", "model.llm.config.intermediate_size=64",
        "model.llm.config.num_attention_heads=2", "model.llm.config.num_key_value_heads=1",
        "model.llm.config.head_dim=16", "train.progress=false", "train.tensorboard=false", "diagnose.report=false",
        "train.export_safetensors=false", "data.num_workers=0"]


def run(argv: list[str], tmp: Path, want: str = "err") -> tuple[str, int]:
    err, out = io.StringIO(), io.StringIO()
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    logging.getLogger("brisk").removeHandler(handler)
    text = {"err": err.getvalue(), "out": out.getvalue()}[want]
    text = text.replace(str(tmp), "<tmp>").replace(str(REPO), "<repo>")
    return text, rc


def first(text: str, pattern: str) -> str:
    return next((line for line in text.splitlines() if re.search(pattern, line)), "(not printed)")


def jsonl(tmp: Path, name: str, lines: list[str]) -> str:
    p = tmp / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(p)


def main_table() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="brisk_trouble_"))
    demo = [x.replace("!audio/", f"!{DATA}/audio/") for x in (DATA / "train.jsonl").read_text(encoding="utf-8").splitlines()[:12]]
    rows = []

    def case(what: str, argv: list[str], pick: str = r"^error: ", want: str = "err", shown: str | None = None):
        text, rc = run(argv, tmp, want)
        rows.append((what, shown or "brisk " + " ".join(a.replace(str(tmp), "<tmp>").replace(str(REPO) + "/", "")
                                                        for a in argv), first(text, pick), rc))

    c = str(DEMO)
    case("a value that is not allowed", ["train", c, "train.device=gpu"])
    case("a negative learning rate", ["train", c, "optim.lr=-1"])
    case("a word where a number goes (LLM config)", ["train", c, "model.llm.config.hidden_size=abc"])
    case("a misspelt LLM config key", ["train", c, "model.llm.config.hidden_sizee=64"])
    case("a model_type transformers does not know", ["train", c, "model.llm.config.model_type=qwen33"])
    case("zero or negative epochs", ["train", c, "train.max_epochs=-1"])
    case("a key without a value", ["train", "train.max_epochs"])
    case("a misspelt key", ["train", c, "train.max_stepz=3"])
    case("a word where a number goes", ["train", c, "train.max_steps=lots"])
    case("adaptor downsampling without the low frame rate", ["train", c, "model.adaptor.downsample_rate=2"])
    case("a word where true/false goes", ["train", c, "speed.compile=maybe"])
    case("a switch that needs another", ["train", c, "speed.cuda_graph=true"])
    case("a data file that does not exist", ["train", c, "data.train=nope.jsonl"])
    case("a config file that does not exist", ["train", "missing.yaml"])
    case("a CUDA device on a machine without one", ["train", c, *TINY, f"train.output_dir={tmp}/cuda", "train.device=cuda"],
         shown="brisk train configs/demo.yaml train.device=cuda (no GPU)")

    run_dir = tmp / "run"
    run(["train", c, *TINY, f"train.output_dir={run_dir}", "train.max_steps=2", "data.valid=null"], tmp)
    case("training into a folder that holds a run", ["train", c, *TINY, f"train.output_dir={run_dir}", "train.max_steps=2"],
         shown="brisk train configs/demo.yaml train.output_dir=<a run folder> (a second time)")
    case("train.resume=true where there is nothing to resume",
         ["train", c, *TINY, f"train.output_dir={tmp}/fresh", "train.max_steps=1", "train.resume=true", "data.valid=null"],
         pick="nothing to resume", want="out", shown="brisk train configs/demo.yaml train.output_dir=<new folder> train.resume=true")
    case("resuming with a changed config",
         ["train", c, *TINY, f"train.output_dir={run_dir}", "train.max_steps=3", "train.resume=true", "optim.lr=0.001",
          "data.valid=null"], pick="differs from the checkpoint", want="out",
         shown="brisk train configs/demo.yaml train.output_dir=<a run folder> train.resume=true optim.lr=0.001")

    missing = list(demo)
    for i in (2, 5, 9):
        missing[i] = missing[i].replace(f"!{DATA}/audio/", f"!{tmp}/gone/")
    case("audio files that do not exist", ["train", c, *TINY, f"train.output_dir={tmp}/m", f"data.train={jsonl(tmp, 'missing.jsonl', missing)}"],
         shown="brisk train configs/demo.yaml data.train=<jsonl naming 3 missing files>")
    broken = list(demo)
    broken[3] = '{"key": "x", "messages": [{"role": "user" "content": "a"}]}'
    case("a line that is not JSON", ["train", c, *TINY, f"train.output_dir={tmp}/b", f"data.train={jsonl(tmp, 'broken.jsonl', broken)}"],
         shown="brisk train configs/demo.yaml data.train=<jsonl missing a comma on line 4>")
    wrong = list(demo)
    obj = json.loads(wrong[1])
    obj["speech_length"] = 5
    wrong = [json.dumps(obj, ensure_ascii=False)] * 3
    case("a wrong speech_length (seen in a DataLoader worker)",
         ["train", c, *TINY, f"train.output_dir={tmp}/w", f"data.train={jsonl(tmp, 'wrong.jsonl', wrong)}", "data.num_workers=1"],
         shown="brisk train configs/demo.yaml data.train=<jsonl declaring 5 frames> data.num_workers=1")
    long = list(demo)
    obj = json.loads(long[0])
    obj["speech_length"] = 90000
    case("an utterance over the length cap", ["train", c, *TINY, f"train.output_dir={tmp}/l",
                                              f"data.train={jsonl(tmp, 'long.jsonl', [json.dumps(obj, ensure_ascii=False)])}"],
         shown="brisk train configs/demo.yaml data.train=<jsonl declaring 90000 frames>")
    (tmp / "corrupt.wav").write_bytes(b"RIFF not really a wav file")
    obj = json.loads(demo[0])
    obj["messages"][1]["content"] = f"语音转写：<|startofspeech|>!{tmp}/corrupt.wav<|endofspeech|>"
    case("an audio file that cannot be read", ["train", c, *TINY, f"train.output_dir={tmp}/u",
                                               f"data.train={jsonl(tmp, 'corrupt.jsonl', [json.dumps(obj, ensure_ascii=False)])}"],
         shown="brisk train configs/demo.yaml data.train=<jsonl naming a corrupt wav>")

    case("a report of a folder that is not a run", ["report", str(tmp)], shown="brisk report <any folder>")
    case("probe compare without probe records", ["probe", "compare", str(run_dir), str(run_dir)],
         shown="brisk probe compare <run> <run> (trained without probe.enabled=true)")
    for name, lr in (("pa", 0.002), ("pb", 0.002), ("pc", 0.01)):
        run(["train", c, *TINY, f"train.output_dir={tmp}/{name}", "train.max_steps=2", "probe.enabled=true", f"optim.lr={lr}",
             "data.valid=null"], tmp)
    case("probe calibrate on two identical runs", ["probe", "calibrate", f"{tmp}/pa", f"{tmp}/pb"], pick=r"^warning",
         shown="brisk probe calibrate <run> <same run again>")
    case("probe calibrate on runs with different learning rates", ["probe", "calibrate", f"{tmp}/pa", f"{tmp}/pc"],
         shown="brisk probe calibrate <run lr=0.002> <run lr=0.01>")

    print("| mistake | command | what brisk prints | exit |")
    print("|---|---|---|---|")
    for what, cmd, line, rc in rows:
        line = re.sub(r"^\d\d:\d\d:\d\d ", "", line).replace("|", "\\|")
        print(f"| {what} | `` {cmd} `` | `` {line} `` | {rc} |")


if __name__ == "__main__":
    main_table()
