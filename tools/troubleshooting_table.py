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
import os
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brisk.cli import main  # noqa: E402

DEMO = REPO / "configs" / "demo.yaml"
DATA = REPO / "data" / "demo"
TINY = ["fun_asr_nano.encoder.output_size=32", "fun_asr_nano.encoder.linear_units=64", "fun_asr_nano.encoder.num_blocks=2",
        "fun_asr_nano.encoder.tp_blocks=1", "fun_asr_nano.adaptor.ffn_dim=64", "fun_asr_nano.adaptor.n_layer=1",
        "model.llm.config.hidden_size=32", "model.llm.config.intermediate_size=64",
        "model.llm.config.num_attention_heads=2", "model.llm.config.num_key_value_heads=1",
        "model.llm.config.head_dim=16", "train.progress=false", "train.tensorboard=false", "diagnose.report=false",
        "train.export=none", "data.num_workers=0",
        "train.val_decode=0", "train.max_epochs=1"]


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
    text = text.replace(str(tmp), "<tmp>").replace(str(REPO), "<repo>").replace(f"process {os.getpid()} ", "process <pid> ")
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
    case("a key an older brisk had elsewhere", ["train", c, "model.encoder.num_blocks=2"])
    case("a word where a number goes", ["train", c, "train.max_steps=lots"])
    case("adaptor downsampling without the low frame rate", ["train", c, "fun_asr_nano.adaptor.downsample_rate=2"])
    case("a word where true/false goes", ["train", c, "speed.compile=maybe"])
    case("a switch that needs another", ["train", c, "speed.cuda_graph=true"])
    case("the optimizer in the backward with clipping", ["train", c, "speed.fused_adamw=true",
                                                          "speed.optimizer_in_backward=true"])
    case("a data file that does not exist", ["train", c, "data.train=nope.jsonl"])
    case("a folder of audio as data.train", ["train", c, *TINY, f"train.output_dir={tmp}/fo", f"data.train={DATA / 'audio' / 'valid'}"],
         shown="brisk train configs/demo.yaml data.train=data/demo/audio/valid")
    case("no data.train (said before the model is built)", ["train", "sft_demo", "data.train=none",
                                                              f"train.output_dir={tmp}/nt"])
    (tmp / "mine.yaml").write_text("include: demo\ntrain:\n  max_epoch: 3\n", encoding="utf-8")
    case("a misspelt key in a YAML file", ["train", str(tmp / "mine.yaml")],
         shown="brisk train mine.yaml (include: demo, train: max_epoch: 3)")
    case("a config file that does not exist", ["train", "missing.yaml"])
    (tmp / "chat.parquet").write_bytes(b"PAR1")
    case("a parquet file as speech data", ["train", c, f"train.output_dir={tmp}/pq", f"data.train={tmp / 'chat.parquet'}"],
         shown="brisk train configs/demo.yaml data.train=chat.parquet")
    case("speech jsonl as chat data", ["train", "sft_demo", f"train.output_dir={tmp}/sj", f"data.train={DATA / 'valid.jsonl'}"],
         shown="brisk train sft_demo data.train=data/demo/valid.jsonl")
    case("a config key given as an option", ["train", "--device", "cuda"], shown="brisk train --device cuda")
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
         ["train", c, *TINY, f"train.output_dir={run_dir}", "train.max_steps=3", "train.resume=true", "optim.lr=0.003",
          "data.valid=null"], pick="differs from the checkpoint", want="out",
         shown="brisk train configs/demo.yaml train.output_dir=<a run folder> train.resume=true optim.lr=0.003")

    case("resuming with another model (shapes)",
         ["train", c, *TINY, f"train.output_dir={run_dir}", "train.max_steps=3", "train.resume=true",
          "model.llm.config.hidden_size=64", "data.valid=null"],
         shown="brisk train configs/demo.yaml train.output_dir=<a run folder> train.resume=true model.llm.config.hidden_size=64")
    case("brisk eval --device cuda on a machine without CUDA", ["eval", str(run_dir), str(DATA / "valid.jsonl"), "--device", "cuda"],
         shown="brisk eval <run> data/demo/valid.jsonl --device cuda (no GPU)")
    case("brisk transcribe --device cuda on a machine without CUDA", ["transcribe", str(run_dir), "a.wav", "--device", "cuda"],
         shown="brisk transcribe <run> a.wav --device cuda (no GPU)")
    case("a bad override of the demo (no folder is left behind)", ["train", "optim.lr=abc"])

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
    nolen = json.loads(demo[2])
    del nolen["speech_length"]
    case("a line without speech_length", ["train", c, *TINY, f"train.output_dir={tmp}/sl",
                                           f"data.train={jsonl(tmp, 'nolen.jsonl', demo[:2] + [json.dumps(nolen, ensure_ascii=False)])}"],
         shown="brisk train configs/demo.yaml data.train=<jsonl whose line 3 has no speech_length>")
    case("a malformed line (eval)", ["eval", str(run_dir), jsonl(tmp, 'nolen.jsonl', demo[:2] + [json.dumps(nolen, ensure_ascii=False)])],
         shown="brisk eval <run> <jsonl whose line 3 has no speech_length>")
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

    latin1 = tmp / "latin1.jsonl"
    latin1.write_bytes(demo[0].encode() + b"\n" + demo[1].replace("语音转写", "Transcrição").encode("latin-1", "replace") + b"\n")
    case("a jsonl that is not UTF-8", ["train", c, *TINY, f"train.output_dir={tmp}/n", f"data.train={latin1}"],
         shown="brisk train configs/demo.yaml data.train=<jsonl with a Latin-1 line 2>")
    case("a jsonl that is not UTF-8 (eval)", ["eval", str(run_dir), str(latin1)],
         shown="brisk eval <run> <jsonl with a Latin-1 line 2>")
    (tmp / "bad.yaml").write_text("train:\n  max_steps: 3\n  lr: [1, 2\nmodel:\n  x: 1\n", encoding="utf-8")
    case("a YAML syntax error", ["train", str(tmp / "bad.yaml")], shown="brisk train <yaml with an unclosed [ on line 3>")
    case("a config name that is not shipped", ["train", "fun_asr_nanoo"])
    folder = list(demo)
    (tmp / "folder.wav").mkdir()
    folder[1] = folder[1].replace(folder[1].split("<|startofspeech|>!")[1].split("<|endofspeech|>")[0], str(tmp / "folder.wav"))
    case("an audio path that is a folder", ["train", c, *TINY, f"train.output_dir={tmp}/f", f"data.train={jsonl(tmp, 'folder.jsonl', folder)}"],
         shown="brisk train configs/demo.yaml data.train=<jsonl naming a folder>")
    obj = json.loads(demo[0])
    obj["messages"][-1]["content"] = " ".join(["red fox"] * 20)
    obj["text_length"] = 5
    case("a declared text_length far below the tokens", ["train", c, *TINY, f"train.output_dir={tmp}/t",
                                                         f"data.train={jsonl(tmp, 'text.jsonl', [json.dumps(obj, ensure_ascii=False)])}"],
         shown="brisk train configs/demo.yaml data.train=<jsonl: a 40-word answer declaring text_length 5>")
    (tmp / "afile").write_text("x")
    case("train.output_dir that is a file", ["train", c, *TINY, f"train.output_dir={tmp}/afile"],
         shown="brisk train configs/demo.yaml train.output_dir=<a file>")
    case("train.output_dir under /proc", ["train", c, *TINY, "train.output_dir=/proc/brisk_run"],
         shown="brisk train configs/demo.yaml train.output_dir=/proc/brisk_run")
    import errno
    from unittest import mock

    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    with mock.patch.object(Path, "mkdir", read_only):  # a read-only mount needs privileges this tool should not take
        case("train.output_dir on a read-only filesystem", ["train", c, *TINY, f"train.output_dir={tmp}/ro/run"],
             shown="brisk train configs/demo.yaml train.output_dir=<a folder on a read-only mount> (simulated)")
    from brisk.train.run_dir import run_lock

    with run_lock(tmp / "busy"):  # another process training there (the lock is per open file: same effect)
        case("a second run into a folder in use", ["train", c, *TINY, f"train.output_dir={tmp}/busy", "train.overwrite=true"],
             shown="brisk train configs/demo.yaml train.output_dir=<a folder another brisk is training in> train.overwrite=true")
    run(["train", c, *TINY, f"train.output_dir={tmp}/failed", f"data.train={tmp}/missing.jsonl"], tmp)
    case("the same command after a failed start", ["train", c, *TINY, f"train.output_dir={tmp}/failed", "train.max_steps=1",
                                                   "data.valid=null"], pick="never reached its first checkpoint", want="out",
         shown="brisk train configs/demo.yaml train.output_dir=<folder of a start that failed on its data> (data fixed)")
    import torch

    class RunsACommand:
        def __reduce__(self):
            return (os.system, (f"touch {tmp}/MARKER",))

    torch.save({"state_dict": {}, "x": RunsACommand()}, tmp / "evil.pt")
    case("a model.pt that would run code when loaded", ["train", c, *TINY, f"train.output_dir={tmp}/e", f"model.init={tmp}/evil.pt"],
         shown="brisk train configs/demo.yaml model.init=<a pickle that runs a command>")
    torch.save({"state_dict": {"encoder.foo": torch.zeros(2)}}, tmp / "other.pt")
    case("a model.pt of another model", ["train", c, *TINY, f"train.output_dir={tmp}/o", f"model.init={tmp}/other.pt"],
         shown="brisk train configs/demo.yaml model.init=<a model.pt with other keys>")
    run(["train", c, *TINY, f"train.output_dir={tmp}/x", "train.max_steps=1", "data.valid=null", "train.export=funasr"], tmp)
    (tmp / "taken").mkdir()
    case("exporting into a folder that exists (--out)", ["export", f"{tmp}/x", "--out", f"{tmp}/taken"],
         shown="brisk export <run> --out <an existing folder>")
    import yaml as _yaml

    raw = _yaml.safe_load((tmp / "x" / "config.yaml").read_text(encoding="utf-8"))
    raw["model"]["llm"]["config"]["hidden_size"] = 64
    (tmp / "x" / "config.yaml").write_text(_yaml.safe_dump(raw), encoding="utf-8")
    case("eval of a run whose config.yaml and checkpoint disagree", ["eval", f"{tmp}/x", str(DATA / "valid.jsonl")],
         shown="brisk eval <run whose config.yaml was edited to hidden_size 64> data/demo/valid.jsonl")
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

    # model.family=causal_lm (the chat family): its data lines and the speech-only keys
    sft = str(REPO / "configs" / "sft_demo.yaml")
    chat = (REPO / "data" / "chat_demo" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    case("chat: a speech switch with model.family=causal_lm", ["train", sft, "speed.frozen_eval=true"])
    case("chat: the encoder's activation checkpointing", ["train", sft, "model.encoder.activation_checkpoint=1"])
    case("chat: a FunASR export of a chat model", ["train", sft, "train.export=funasr"])
    case("chat: a LoRA target the model does not have", ["train", sft, f"train.output_dir={tmp}/lt", "train.max_steps=1",
                                                          "model.llm.lora.enabled=true", "model.llm.lora.target_modules=[qkv]"])
    case("chat: an adapter dtype other than fp32 or the base's", ["train", sft, "model.llm.lora.enabled=true",
                                                                  "model.llm.lora.dtype=bf16"])
    norole = list(chat)
    norole[2] = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"content": "hello"}]})
    case("chat: a turn without a role", ["train", sft, f"train.output_dir={tmp}/cr", f"data.train={jsonl(tmp, 'norole.jsonl', norole)}"],
         shown="brisk train configs/sft_demo.yaml data.train=<chat jsonl, line 3: a turn without a role>")
    noanswer = list(chat)
    noanswer[4] = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    case("chat: a conversation without an assistant turn",
         ["train", sft, f"train.output_dir={tmp}/cn", f"data.train={jsonl(tmp, 'noanswer.jsonl', noanswer)}"],
         shown="brisk train configs/sft_demo.yaml data.train=<chat jsonl, line 5: no assistant turn>")

    unlabelled = list(chat[:3]) + [json.dumps({"messages": [{"role": "user", "content": " ".join(["dog"] * 80)},
                                                             {"role": "assistant", "content": "dog"}]})] * 2
    case("chat: conversations with no assistant token within causal_lm.max_len",
         ["train", sft, f"train.output_dir={tmp}/cl", "train.max_steps=1", "causal_lm.max_len=64", "data.valid=none",
          f"data.train={jsonl(tmp, 'unlabelled.jsonl', unlabelled)}"], pick="dropped", want="out",
         shown="brisk train configs/sft_demo.yaml causal_lm.max_len=64 data.train=<chat jsonl with 2 user turns of 80 words>")
    # model.family: keys that moved, the old task word, an unknown family, and what Qwen3-ASR does not take
    q3 = str(REPO / "configs" / "qwen3_asr_demo.yaml")
    case("a key that moved into its family's section", ["train", q3, "data.language=English"])
    case("the old `task:` word", ["train", c, "task=chat"])
    case("an unknown model family", ["train", q3, "model.family=whisper"])
    case("a misspelt model family", ["train", q3, "model.family=qwen3asr"])
    case("qwen3_asr: a switch it does not take", ["train", q3, "speed.liger=true"])
    case("qwen3_asr: a FunASR export", ["train", q3, "train.export=funasr"])

    print("| mistake | command | what brisk prints | exit |")
    print("|---|---|---|---|")
    for what, cmd, line, rc in rows:
        line = re.sub(r"^\d\d:\d\d:\d\d ", "", line).replace("|", "\\|")
        print(f"| {what} | `` {cmd} `` | `` {line} `` | {rc} |")


if __name__ == "__main__":
    main_table()
