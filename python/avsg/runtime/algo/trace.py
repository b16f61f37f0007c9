"""Selections from a recorded trace, around any algorithm's Index and Attention.

With random weights the model's own indexer selects without the locality of a trained model.
``TraceSelection`` replays a real selection trace instead (format: ``avsg.lab.traces.format``):

* model layer ``l`` of ``layers`` reads trace layer ``l * trace_layers // layers`` (the MTP
  layer, last, maps to the last trace layer);
* the query token at position ``p`` reads trace step ``p - positions[0]`` (clamped to the trace),
  so requests whose contexts end at different trace steps have different context lengths, and
  MTP draft tokens read the trace's following steps, as the trace lab's MTP replay does;
* any selection at or beyond the token's causal length is dropped (``-1``), so a selection is
  always causal whatever trace is replayed.

Index and Attention are the wrapped algorithm's (``DSA``): index keys are still written, and
attention is exact sparse MLA over the trace's entries.

``TraceRecorder`` does the converse: it collects what an algorithm selected into a trace.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from ...lab.traces.format import Trace, smallest_sel_dtype
from ..base import Retrieved, SparseAlgorithm, register_algorithm
from ..step import StepBatch


@register_algorithm
class TraceSelection(SparseAlgorithm):
    name = "trace"

    def __init__(self, inner: SparseAlgorithm, trace: Trace, layers: int, topk: int,
                 device: torch.device):
        if trace.k != topk:
            raise ValueError(f"trace: selects top-{trace.k} but the model's index_topk is {topk}")
        if trace.sel.ndim != 3:
            raise ValueError("trace: expected sel [layers, steps, k] (one query per step)")
        self.inner = inner
        self.trace = trace
        self.layers = layers
        self.first_position = int(trace.positions[0])
        self.steps = trace.steps
        sel = torch.from_numpy(trace.sel.astype(np.int32))
        trace_layer = [l * trace.layers // layers for l in range(layers)]
        self._sel = sel[trace_layer].to(device)          # [layers, steps, K]

    @property
    def positions(self) -> range:
        """Query positions the trace covers."""
        return range(self.first_position, self.first_position + self.steps)

    def index(self, layer, batch, attn, x, q_resid) -> None:
        self.inner.index(layer, batch, attn, x, q_resid)

    def select(self, layer: int, batch: StepBatch, attn, x, q_resid) -> torch.Tensor:
        step = (batch.pos.long() - self.first_position).clamp(0, self.steps - 1)
        chosen = self._sel[layer][step]                  # [R, T, K]
        causal = chosen < batch.causal_lens[..., None]
        return torch.where(causal, chosen, torch.full_like(chosen, -1)).contiguous()

    def attention(self, layer, batch, attn, q_nope, q_pe, retrieved: Retrieved) -> torch.Tensor:
        return self.inner.attention(layer, batch, attn, q_nope, q_pe, retrieved)

    def fill(self, layer, row, start, index_keys) -> None:
        self.inner.fill(layer, row, start, index_keys)

    def invalidate(self, valid_lens, layers=None) -> None:
        self.inner.invalidate(valid_lens, layers)

    def reset(self, rows) -> None:
        self.inner.reset(rows)


class TraceRecorder:
    """Collects query token 0 of ``row`` in every decode verify pass into a trace.

    Use as ``ForwardContext.recorder``; the engine calls ``end_step(pos)`` after each step.
    """

    def __init__(self, layers: int, topk: int, row: int = 0):
        self.layers, self.topk, self.row = layers, topk, row
        self._current: List[Optional[np.ndarray]] = [None] * layers
        self._steps: List[np.ndarray] = []
        self._positions: List[int] = []

    def __call__(self, layer: int, topk_pos: torch.Tensor) -> None:
        if layer < self.layers:
            self._current[layer] = topk_pos[self.row, 0].cpu().numpy()

    def end_step(self, position: int) -> None:
        if any(s is None for s in self._current):
            return
        rows = []
        for selected in self._current:
            valid = np.sort(selected[selected >= 0])
            rows.append(np.concatenate([valid, np.full(self.topk - valid.size, -1)]))
        self._steps.append(np.stack(rows))
        self._positions.append(position)
        self._current = [None] * self.layers

    def trace(self, context_len: int, model: str, rule: str) -> Trace:
        if not self._steps:
            raise ValueError("the recorder saw no decode step")
        sel = np.stack(self._steps, axis=1)                  # [layers, steps, K]
        padded = bool((sel < 0).any())
        sel = sel.astype(smallest_sel_dtype(context_len, padded))
        return Trace(sel, np.asarray(self._positions, dtype=np.int32), T=int(context_len),
                     k=self.topk, model=model, rule=rule)
