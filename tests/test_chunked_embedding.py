"""speed.cuda_graph looks token ids up in chunks (CUDA's long-input embedding backward syncs with the host):
the chunked lookup must give the plain lookup's output and gradient, and leave the state_dict alone."""

from __future__ import annotations

import torch

from brisk.speed import graph

from .conftest import TINY_QWEN3


def test_chunked_lookup_equals_the_plain_one(monkeypatch):
    monkeypatch.setattr(graph, "EMBED_CHUNK", 7)  # a small chunk: 3 x 20 ids cross several chunk borders
    torch.manual_seed(0)
    plain = torch.nn.Embedding(50, 8)
    chunked = graph.ChunkedEmbedding(50, 8)
    chunked.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 50, (3, 20))
    ids[0, :5] = 4  # repeated ids: their gradients add up across chunks
    a, b = plain(ids), chunked(ids)
    assert b.shape == (3, 20, 8) and torch.equal(a, b)
    w = torch.randn(3, 20, 8)
    (a * w).sum().backward()
    (b * w).sum().backward()
    assert torch.allclose(plain.weight.grad, chunked.weight.grad, rtol=1e-6, atol=1e-6)
    short = torch.randint(0, 50, (1, 5))  # at most one chunk: the plain call itself
    assert torch.equal(plain(short), chunked(short))


def test_the_swap_keeps_the_weight_the_tie_and_the_keys():
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = dict(TINY_QWEN3)
    llm = AutoModelForCausalLM.from_config(AutoConfig.for_model(extra.pop("model_type"), **extra))
    weight, keys = llm.get_input_embeddings().weight, list(llm.state_dict())
    note = graph.apply_chunked_embedding(llm)
    emb = llm.get_input_embeddings()
    assert isinstance(emb, graph.ChunkedEmbedding) and "chunks" in note
    assert emb.weight is weight and llm.lm_head.weight is weight  # tied embeddings stay tied
    assert list(llm.state_dict()) == keys and "forward" not in emb.__dict__
