"""Requests and the rows they occupy: plain bookkeeping, no tensors.

The engine owns ``R`` persistent rows. A request waits in FIFO order until a row is free, is
admitted into it (its KV store row and algorithm row are reset and its context is produced), decodes
until it has ``max_new_tokens`` outputs, and frees the row for the next request. So a run shows
continuous batching in steady state, not one static batch.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Deque, Iterable, List, Optional


@dataclasses.dataclass
class Request:
    """One generation request.

    ``prompt`` given: a real prefill through the model (short prompts). Otherwise the context of
    ``context_len`` positions is produced by the linear-cost context fill and decoding starts
    from ``first_token`` at position ``context_len``.
    """
    id: int
    max_new_tokens: int
    prompt: Optional[List[int]] = None
    context_len: int = 0
    first_token: int = 0
    seed: int = 0
    output: List[int] = dataclasses.field(default_factory=list)
    steps: int = 0
    drafts_offered: int = 0
    drafts_accepted: int = 0

    def __post_init__(self):
        if self.prompt is not None:
            if not self.prompt:
                raise ValueError(f"request {self.id}: prompt: expected at least one token")
            self.context_len = len(self.prompt)
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.id}: max_new_tokens: expected >= 1, "
                             f"got {self.max_new_tokens}")

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


class Scheduler:
    def __init__(self, rows: int, requests: Iterable[Request] = ()):
        self.rows = rows
        self.waiting: Deque[Request] = collections.deque(requests)
        self.running: List[Optional[Request]] = [None] * rows
        self.finished: List[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def free_rows(self) -> List[int]:
        return [r for r, req in enumerate(self.running) if req is None]

    def admit_next(self, row: int) -> Optional[Request]:
        if self.running[row] is not None or not self.waiting:
            return None
        request = self.waiting.popleft()
        self.running[row] = request
        return request

    def finish(self, row: int) -> Request:
        request = self.running[row]
        self.running[row] = None
        self.finished.append(request)
        return request

    @property
    def idle(self) -> bool:
        return not self.waiting and all(r is None for r in self.running)
