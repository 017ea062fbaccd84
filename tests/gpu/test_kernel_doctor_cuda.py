"""`brisk doctor --kernels` on CUDA (skipped without CUDA, fla or liger): every kernel the plan would use runs at
the config's shapes and is within its bf16 bound, with a speed against the path it replaces; with speed.compile
on, the compiled decoder layer too.

    python -m pytest tests/gpu/test_kernel_doctor_cuda.py -q      # on the GPU machine, with fla-core + liger-kernel
"""

from __future__ import annotations

import pytest
import torch

from brisk.diagnose.kernel_doctor import kernel_doctor

from .test_llm_kernels_cuda import ROOT, needs_fla
from .test_llm_step_cuda import QWEN3_5_2B_HEADS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_every_kernel_of_the_hybrid_plan_is_within_its_bound():
    needs_fla()
    pytest.importorskip("liger_kernel")
    # bf16, as the sft configs run it: the plan refuses an fp32 hybrid wherever fla would run it (round 9)
    text = kernel_doctor(str(ROOT / "configs/sft_demo.yaml"), [*QWEN3_5_2B_HEADS, "model.llm.dtype=bf16",
                                                                 "speed.preset=fast", "speed.liger=true"])
    rows = _rows(text)
    for name in ("chunk_gated_delta_rule", "causal_conv1d", "gated RMSNorm", "liger RMSNorm", "liger SwiGLU",
                 "fused linear cross-entropy", "FlashAttention-2 varlen"):
        assert any(name in r for r in rows), (name, text)
    assert all("| within |" in r and " vs " in r for r in rows), text
    assert "OUTSIDE" not in text


def test_the_compiled_decoder_layer_when_the_plan_compiles():
    text = kernel_doctor(str(ROOT / "configs/sft_demo.yaml"), ["model.llm.dtype=bf16", "speed.preset=fast",
                                                               "speed.compile=true"])
    row = next(r for r in _rows(text) if r.startswith("| compiled decoder layer"))
    assert "| within |" in row and "compiled in" in row, text
