"""Contexts at linear cost: the KV and index keys of a long context without a quadratic prefill.

A 2-core machine cannot prefill 32K tokens through attention. What decode needs from a context is
its per-layer MLA KV (latent + RoPE key) and indexer keys, and those are per-token projections of
each layer's input. The fill draws seeded hidden states (unit RMS, like a normed layer input) for
every layer and position and runs them through the layer's own projections
(``model.context_kv``): the cost is linear in the context, and the values have the statistics of
this model's projections. They are not what a real prefill of some text would produce; the
selection trace supplies realistic locality instead.

All requests read one **document**: request contexts are prefixes of it, of different lengths, as
the requests of a trace-driven run are prefixes of the trace's text. The document is produced
once, to the longest length asked for, and kept in host memory, so a run that compares three
modes pays for it once. Short prompts take the real path instead: a prefill through the model
(the engine does it when a request has a ``prompt``).
"""
from __future__ import annotations

from typing import List, Tuple

import torch

from ..kvformat import KVFormat

FILL_CHUNK = 4096

LayerContext = Tuple[Tuple[torch.Tensor, ...], torch.Tensor]   # (KV components, index keys)


class ContextFill:
    def __init__(self, model, kv_format: KVFormat, document_seed: int = 0,
                 chunk: int = FILL_CHUNK):
        self.model = model
        self.kv_format = kv_format
        self.document_seed = document_seed
        self.chunk = chunk
        self._layers: List[LayerContext] = []
        self._length = 0

    def produce(self, length: int) -> List[LayerContext]:
        """Per KV layer: the document's first ``length`` positions (KV components ``[length,
        width]`` in the store's format, index keys ``[length, d]``)."""
        if length > self._length:
            self._extend(length)
        return [(tuple(part[:length] for part in parts), keys[:length])
                for parts, keys in self._layers]

    def _extend(self, length: int) -> None:
        config = self.model.config
        device = next(self.model.parameters()).device
        new_layers = []
        for layer in range(self.model.num_kv_layers):
            # one generator per layer, advanced chunk by chunk: any prefix is the same document
            generator = torch.Generator().manual_seed(self.document_seed * 1_000_003 + layer)
            parts_chunks, key_chunks = [], []
            for start in range(0, length, self.chunk):
                n = min(self.chunk, length - start)
                hidden = torch.randn(n, config.hidden_size, generator=generator).to(device)
                pos = torch.arange(start, start + n, dtype=torch.int32, device=device)
                with torch.no_grad():
                    latent, k_pe, index_key = self.model.context_kv(layer, hidden, pos)
                parts_chunks.append(self.kv_format.encode(latent, k_pe))
                key_chunks.append(index_key)
            parts = tuple(torch.cat([c[i] for c in parts_chunks])
                          for i in range(len(self.kv_format.components)))
            new_layers.append((parts, torch.cat(key_chunks)))
        self._layers, self._length = new_layers, length

    def fill(self, row: int, length: int, store, algo) -> None:
        """Write the document's first ``length`` positions into ``row`` of the store and algorithm."""
        for layer, (parts, index_keys) in enumerate(self.produce(length)):
            store.fill(layer, row, 0, parts)
            algo.fill(layer, row, 0, index_keys)
