"""`brisk doctor`: what this machine will do to a fine-tuning run, and what to do about it.

Checks the GPU and its compute capability, torch/CUDA/cuDNN versions, the SDPA priority order, whether a
padded-mask attention call would take cuDNN here (by running one small call under the profiler), the
Inductor cache location, and known traps. On a machine without a GPU it says what it could not check.
"""

from __future__ import annotations

import os
import platform
import tempfile

import torch

from .accel import masked_sdpa_backend, sdpa_order


def doctor() -> str:
    lines = ["# brisk doctor", ""]
    lines.append(f"- python {platform.python_version()}, torch {torch.__version__}")
    try:
        import transformers

        lines.append(f"- transformers {transformers.__version__}")
    except ImportError:
        lines.append("- transformers is NOT installed")
    from ..versions import outside_tested

    versions = outside_tested()
    lines += [f"- {v}" for v in versions] or ["- every installed package brisk uses is within its tested range "
                                              "(floors in brisk's metadata, last tested in brisk/constraints.txt)"]
    order = sdpa_order()
    lines.append(f"- SDPA priority order: {' > '.join(order) or 'unknown'}; enabled: flash={torch.backends.cuda.flash_sdp_enabled()}, "
                 f"efficient={torch.backends.cuda.mem_efficient_sdp_enabled()}, math={torch.backends.cuda.math_sdp_enabled()}, "
                 f"cudnn={torch.backends.cuda.cudnn_sdp_enabled()}")
    env = os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED")
    lines.append(f"- TORCH_CUDNN_SDPA_DEPRIORITIZED={env or '(unset)'}")
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"torchinductor_{os.environ.get('USER', 'root')}")
    lines.append(f"- Inductor cache: {cache} ({'exists' if os.path.isdir(cache) else 'not created yet'}); set speed.inductor_cache_dir "
                 "to a persistent folder so a second run compiles from cache")
    traps = []
    if not torch.cuda.is_available():
        lines += ["- no CUDA device: GPU checks skipped (compute capability, the SDPA kernel a padded mask takes, "
                  "cuDNN version, memory). Run `brisk doctor` on the training machine."]
    else:
        dev = torch.device("cuda")
        p = torch.cuda.get_device_properties(dev)
        lines.append(f"- GPU: {p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs; "
                     f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
        taken = masked_sdpa_backend(dev)
        lines.append(f"- a padded-mask bf16 attention call here takes: {taken}")
        if p.major in (9, 10) and taken == "cuDNN":
            traps.append("cuDNN SDPA plan builds: on this sm_{}{} GPU the LLM's padded-mask attention goes to cuDNN, which "
                         "builds an execution plan for every new (batch, padded length), ~0.5 s forward + ~0.5 s backward. "
                         "Token-bucketed batches hit a new shape every few steps. Fix: speed.sdpa_backends=[flash,efficient,math] "
                         "(scoped to the step) or TORCH_CUDNN_SDPA_DEPRIORITIZED=1; speed.packing avoids the masked call "
                         "altogether. See docs/finetune-speed.md.".format(p.major, p.minor))
        if torch.backends.cuda.matmul.allow_tf32 is False and p.major >= 8:
            lines.append("- TF32 is off for fp32 matmuls (torch's default); speed.tf32=true speeds up an fp32 encoder")
    lines += ["", "## Traps found" if traps else "## No known traps found", ""]
    lines += [f"{i + 1}. {t}" for i, t in enumerate(traps)]
    return "\n".join(lines) + "\n"
