"""FunASR 1.4.16's own trainer as a bench arm: `funasr/bin/train_ds.py` with the flags of FunASR's Fun-ASR-Nano
finetune.sh (examples/industrial_data_pretraining/fun_asr_nano), on the same data and model folder as brisk's
arms, in the same call.

The flags are finetune.sh's, with four differences, each forced by the setting, not chosen:
- ``train_conf.max_epoch`` is the bench's epoch count (finetune.sh: 50);
- ``dataset_conf.num_workers`` is brisk's data.num_workers default, 2 (finetune.sh: 4; the whole-run set is
  360 utterances);
- ``llm_conf.init_param_path`` and ``tokenizer_conf.init_param_path`` are given as absolute paths: FunASR reads
  the config.yaml's relative ``Qwen3-0.6B`` from the current folder, which must be the data's (the jsonl's
  relative audio paths are read from it);
- one process through torchrun, as finetune.sh runs it on one GPU.

FunASR and the packages it imports that the GPU image lacks travel as wheels (`install`, from a folder such as
.whl/funasr): funasr, hydra-core, antlr4-python3-runtime 4.9.3 (built here: it has no wheel), omegaconf,
kaldiio, kaldi-native-fbank, librosa 0.11 with audioread, soxr, pooch, decorator and platformdirs,
more-itertools, tensorboardX, torch-complex, jaconv, jamo.

What is read back (`parse`): each training step's ``total_time`` and loss from FunASR's own log lines ("train,
rank: 0, ... total step: N, (loss_avg_rank: L), ... {'total_time': 'S'} ..."), and the validation loss FunASR
reports at the end of each validation pass ("val, ..., (loss_avg_slice: L)").
"""

from __future__ import annotations

import ast
import re
import statistics
import subprocess
import sys
from pathlib import Path

TRAIN = re.compile(r"\btrain, rank: 0, epoch: (\d+)/\d+, .*?total step: (\d+), \(loss_avg_rank: ([\d.]+)\).*?(\{'data_load'.*?\})")
VAL = re.compile(r"\bval, rank: 0, epoch: (\d+)/\d+, .*?total step: (\d+), .*?\(loss_avg_slice: ([\d.]+)\)")


def install(wheels: Path, target: Path) -> Path:
    """Every wheel in ``wheels`` installed with --no-deps into ``target`` (once); the folder for PYTHONPATH."""
    if not target.is_dir():
        files = [str(f) for f in sorted(wheels.glob("*.whl"))]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(target), *files], check=True)
    return target


def command(model: Path, data: Path, output_dir: Path, epochs: int) -> list[str]:
    """train_ds.py as finetune.sh starts it (the differences are in this module's docstring); run it from ``data``."""
    llm = model / "Qwen3-0.6B"
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "1",
            "--master_port", "26669", "-m", "funasr.bin.train_ds",
            f"++model={model}", "++trust_remote_code=true",
            f"++train_data_set_list={data / 'train.jsonl'}", f"++valid_data_set_list={data / 'valid.jsonl'}",
            "++dataset_conf.data_split_num=1", "++dataset_conf.batch_sampler=BatchSampler",
            "++dataset_conf.batch_size=6000", "++dataset_conf.sort_size=1024", "++dataset_conf.batch_type=token",
            "++dataset_conf.num_workers=2", f"++train_conf.max_epoch={epochs}", "++train_conf.log_interval=1",
            "++train_conf.resume=true", "++train_conf.validate_interval=2000",
            "++train_conf.save_checkpoint_interval=2000", "++train_conf.effective_save_name_excludes=None",
            "++train_conf.keep_nbest_models=20", "++train_conf.avg_nbest_model=10", "++train_conf.use_deepspeed=false",
            "++optim_conf.lr=0.0002", "++audio_encoder_conf.freeze=true", "++audio_adaptor_conf.freeze=true",
            "++llm_conf.freeze=false", f"++llm_conf.init_param_path={llm}", f"++tokenizer_conf.init_param_path={llm}",
            f"++output_dir={output_dir}"]


def parse(log_text: str) -> dict:
    """Steps (each one's total_time and loss) and validation losses (epoch, step, loss) from FunASR's log."""
    steps, val = [], {}
    for line in log_text.splitlines():
        m = TRAIN.search(line)
        if m:
            stats = ast.literal_eval(m.group(4))  # FunASR logs its speed_stats dict with repr()
            steps.append({"epoch": int(m.group(1)), "step": int(m.group(2)), "loss": float(m.group(3)),
                          "total_time": float(stats.get("total_time", "nan"))})
            continue
        m = VAL.search(line)
        if m:  # the last line of a validation pass holds its average over the whole set
            val[int(m.group(1))] = {"epoch": int(m.group(1)), "step": int(m.group(2)), "loss": float(m.group(3))}
    times = [s["total_time"] for s in steps]
    return {"steps_n": len(steps), "steps": sum(times),
            "step_mean_ms": 1000 * statistics.fmean(times) if times else None,
            "step_median_ms": 1000 * statistics.median(times) if times else None,
            "validation_losses": list(val.values())}
