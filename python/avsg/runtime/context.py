"""Contexts at linear cost: the KV and index keys of a long context without a quadratic prefill.

A 2-core machine cannot prefill 32K tokens through attention. What decode needs from the context is
its per-layer MLA KV (latent + RoPE key) and indexer keys, and those are per-token projections of
each layer's input. The fill draws seeded hidden states (unit RMS, like a normed layer input) for
every layer and position and runs them through the layer's own projections
(``model.context_kv``): the cost is linear in the context, and the values have the statistics of
real projections of this model's weights. They are not what a real prefill of some text would
produce; the selection trace supplies realistic locality instead.

Short prompts take the real path: a prefill through the model (``Engine`` does it when a request
has a ``prompt``).

The same request (seed, length) always gets the same context, whichever store runs it. Contexts
are cached in host memory across runs of one process (``cache=True``) so that comparing modes
does not pay the fill three times.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from .kvformat import KVFormat
from .scheduler import Request

FILL_CHUNK = 4096


class ContextFill:
    def __init__(self, model, kv_format: KVFormat, cache: bool = True, chunk: int = FILL_CHUNK):
        self.model = model
        self.kv_format = kv_format
        self.cache_enabled = cache
        self.chunk = chunk
        self._cache: Dict[Tuple[int, int], List[Tuple[Tuple[torch.Tensor, ...], torch.Tensor]]] = {}

    def produce(self, request: Request) -> List[Tuple[Tuple[torch.Tensor, ...], torch.Tensor]]:
        """Per KV layer: (stored KV components ``[C, width]``, index keys ``[C, d]``)."""
        key = (request.seed, request.context_len)
        if key in self._cache:
            return self._cache[key]
        config = self.model.config
        device = next(self.model.parameters()).device
        layers = []
        for layer in range(self.model.num_kv_layers):
            generator = torch.Generator().manual_seed((request.seed * 1_000_003 + layer) % 2**63)
            parts_chunks, key_chunks = [], []
            for start in range(0, request.context_len, self.chunk):
                n = min(self.chunk, request.context_len - start)
                hidden = torch.randn(n, config.hidden_size, generator=generator).to(device)
                pos = torch.arange(start, start + n, dtype=torch.int32, device=device)
                with torch.no_grad():
                    latent, k_pe, index_key = self.model.context_kv(layer, hidden, pos)
                parts_chunks.append(self.kv_format.encode(latent, k_pe))
                key_chunks.append(index_key)
            parts = tuple(torch.cat([c[i] for c in parts_chunks])
                          for i in range(len(self.kv_format.components)))
            layers.append((parts, torch.cat(key_chunks)))
        if self.cache_enabled:
            self._cache[key] = layers
        return layers

    def fill(self, row: int, request: Request, store, algo) -> None:
        for layer, (parts, index_keys) in enumerate(self.produce(request)):
            store.fill(layer, row, 0, parts)
            algo.fill(layer, row, 0, index_keys)
