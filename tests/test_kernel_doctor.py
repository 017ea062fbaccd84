"""`brisk doctor --kernels CONFIG` on the CPU: it checks what runs there (the torch Gated DeltaNet fallback, the
block-causal attention) at the config's head sizes, names what it cannot check (fla, liger: Triton), says where
transformers takes its slow path, and a kernel with a wrong gradient is reported outside its bound."""

from __future__ import annotations

from pathlib import Path

import torch

from brisk.cli import main
from brisk.diagnose.kernel_doctor import _check, kernel_doctor

ROOT = Path(__file__).resolve().parents[1]
TINY_QWEN3_5 = ["model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 64, intermediate_size: 128, "
                "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, "
                "linear_num_key_heads: 2, linear_num_value_heads: 4, linear_key_head_dim: 32, linear_value_head_dim: 32, "
                "linear_conv_kernel_dim: 4, layer_types: [linear_attention, full_attention]}", "speed.preset=fast"]


def test_kernel_doctor_on_the_cpu_checks_the_fallbacks_and_names_what_it_cannot(capsys):
    text = kernel_doctor(str(ROOT / "configs/sft_demo.yaml"), TINY_QWEN3_5)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert any("torch chunk" in r and "K 32" in r and "| within |" in r for r in rows)
    assert any("varlen attention" in r and "| within |" in r for r in rows)
    assert "OUTSIDE" not in text
    assert "preset fast" in text  # the plan as resolved here (the preset trimmed to the CPU)
    assert "torch chunk loop" in text  # transformers' slow path, said plainly
    cannot = text.split("## Not checked here")[1]
    assert "fla" in cannot and "liger" in cannot and "CUDA" in cannot


def test_a_wrong_gradient_is_outside_its_bound():
    x = torch.randn(64, 32)

    def reference(x):
        return x.float().sin()

    def wrong_backward(x):  # right values, gradient off by 10%
        return reference(x) + 0.1 * (reference(x) - reference(x).detach())

    assert _check("ok", "", reference, reference, {"x": x}, torch.randn(64, 32)).ratio <= 1
    bad = _check("bad", "", wrong_backward, reference, {"x": x}, torch.randn(64, 32))
    assert bad.ratio > 1 and bad.worst == "dx" and "OUTSIDE" in bad.line()


def test_the_cli_takes_the_config_and_overrides(capsys):
    assert main(["doctor", "--kernels", str(ROOT / "configs/sft_demo.yaml"), *TINY_QWEN3_5]) == 0
    assert "| Gated DeltaNet" in capsys.readouterr().out


QWEN3_TREE = {"model_type": "qwen3", "vocab_size": 392, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
QWEN3_5_TREE = {"model_type": "qwen3_5_text", "vocab_size": 392, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
                "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
                "layer_types": ["linear_attention", "full_attention"]}


def test_compiled_layer_check_runs_a_packed_row_and_catches_a_wrong_graph():
    """The compiled-decoder check (run on CUDA when the plan compiles) on the CPU with Dynamo's aot_eager backend:
    a dense and a hybrid config's full-attention layer are within bound on a packed row; a backend whose graphs
    return outputs 20% off is reported outside it."""
    from brisk.diagnose.kernel_doctor import check_compiled_layer

    lengths = (3, 17, 30)
    for tree in (QWEN3_TREE, QWEN3_5_TREE):
        torch._dynamo.reset()
        c = check_compiled_layer(tree, lengths, "cpu", backend="aot_eager")
        assert c.ratio <= 1 and c.kernel_ms > 0 and c.fallback_ms > 0, (tree["model_type"], c)
        assert "3 conversations, 50 tokens, hidden 64" in c.shape

    def off_by_a_fifth(gm, example_inputs):
        def run(*args):
            outs = gm(*args)
            return type(outs)(o * 1.2 if torch.is_tensor(o) and o.is_floating_point() else o for o in outs)
        return run

    torch._dynamo.reset()
    bad = check_compiled_layer(QWEN3_TREE, lengths, "cpu", backend=off_by_a_fifth)
    assert bad.ratio > 1 and "OUTSIDE" in bad.line()



def test_flashqla_says_why_it_is_not_checked_where_it_cannot_run(monkeypatch):
    """Without flash-qla the check names why in one line, and on the CPU the doctor says FlashQLA needs CUDA; the
    check itself is a GPU test (tests/gpu/test_gdn_check_cuda.py)."""
    import importlib.util

    from brisk.diagnose import gdn_check as G

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_qla" else real(name, *a))
    assert G.flashqla_refusal().startswith("flash-qla is not installed")
    text = kernel_doctor(str(ROOT / "configs/sft_demo.yaml"), TINY_QWEN3_5)
    assert "- FlashQLA: TileLang kernels need CUDA" in text.split("## Not checked here")[1]
