"""speed.cuda_graph looks token ids up in chunks (CUDA's long-input embedding backward syncs with the host):
the chunked lookup must give the plain lookup's output and gradient, and leave the state_dict alone."""

from __future__ import annotations

import torch

from brisk.speed import graph


def test_chunked_lookup_equals_the_plain_one(monkeypatch):
    monkeypatch.setattr(graph, "EMBED_CHUNK", 7)  # a small chunk: 3 x 20 ids cross several chunk borders
    torch.manual_seed(0)
    plain = torch.nn.Embedding(50, 8)
    chunked = torch.nn.Embedding(50, 8)
    chunked.load_state_dict(plain.state_dict())
    keys = list(chunked.state_dict())
    graph.chunk_embedding(chunked)
    ids = torch.randint(0, 50, (3, 20))
    ids[0, :5] = 4  # repeated ids: their gradients add up across chunks
    a, b = plain(ids), chunked(ids)
    assert b.shape == (3, 20, 8) and torch.equal(a, b)
    w = torch.randn(3, 20, 8)
    (a * w).sum().backward()
    (b * w).sum().backward()
    assert torch.allclose(plain.weight.grad, chunked.weight.grad, rtol=1e-6, atol=1e-6)
    assert list(chunked.state_dict()) == keys
    short = torch.randint(0, 50, (1, 5))  # at most one chunk: the plain call itself
    assert torch.equal(plain(short), chunked(short))
