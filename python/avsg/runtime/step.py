"""What one forward pass over a batch of rows is about: ``StepBatch``, and the phase ``Timers``.

A batch has ``R`` persistent rows (one request each, or idle) and ``T`` query tokens per row
(``T = 1 + n`` for MTP-n decode; the prompt length for a one-row prefill). Everything is a
fixed-shape tensor, so the per-layer code never branches on Python ints that depend on data.

    tokens      int64 [R, T]  token ids fed to the model
    pos         int32 [R, T]  position of each query token (request-relative)
    seq_lens    int32 [R]     KV length of the row after this pass writes its T tokens
                              (``pos[:, -1] + 1``); 0 for an idle row
    causal_lens int32 [R, T]  what query token t may see: positions ``< pos[r, t] + 1``;
                              0 for an idle row, so it selects nothing
    active      bool  [R]     rows that hold a request
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Dict, Iterator, Optional

import torch


@dataclasses.dataclass
class StepBatch:
    tokens: torch.Tensor
    pos: torch.Tensor
    seq_lens: torch.Tensor
    causal_lens: torch.Tensor
    active: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def queries(self) -> int:
        return int(self.tokens.shape[1])

    @classmethod
    def make(cls, tokens: torch.Tensor, start_pos: torch.Tensor,
             active: Optional[torch.Tensor] = None) -> "StepBatch":
        """Rows whose T tokens sit at consecutive positions ``start_pos[r] + t``."""
        R, T = tokens.shape
        if active is None:
            active = torch.ones(R, dtype=torch.bool, device=tokens.device)
        offsets = torch.arange(T, dtype=torch.int32, device=tokens.device)
        pos = start_pos.to(torch.int32)[:, None] + offsets[None, :]
        pos = torch.where(active[:, None], pos, torch.zeros_like(pos))
        causal = torch.where(active[:, None], pos + 1, torch.zeros_like(pos))
        seq_lens = causal[:, -1].contiguous()
        return cls(tokens, pos.contiguous(), seq_lens, causal.contiguous(), active)


class Timers:
    """Wall time per phase, accumulated over a run. ``with timers("plan"): ...``.

    On an accelerator the caller synchronises before reading (``sync``); on CPU the ops run
    eagerly, so wall time is the op's time.
    """

    def __init__(self, sync=None):
        self.totals: Dict[str, float] = {}
        self.enabled = True
        self._sync = sync

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self._sync:
            self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._sync:
                self._sync()
            self.totals[phase] = self.totals.get(phase, 0.0) + time.perf_counter() - start

    def reset(self) -> None:
        self.totals.clear()


NULL_TIMERS = Timers()
NULL_TIMERS.enabled = False
