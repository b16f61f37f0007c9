"""The serving workload: arrivals, lengths, and each request's locality from real selection traces.

* **Arrivals**: Poisson, ``rate`` requests per second.
* **Prompt (context) lengths**: log-normal with a 48K-token mean (the AVSG paper's long-context
  workload), sigma 0.6 of the underlying normal, clipped to [8K, 128K] tokens. Agentic workloads run
  longer (KARAT reports p50 of 83-149K): pass ``prompt_mean`` to move the distribution.
* **Output lengths**: log-normal with a 384-token mean, sigma 0.8, clipped to [32, steps of the
  locality source] -- a request replays its locality row from the first decode step.
* **Locality**: each request draws one row (one layer) of a selection trace; its decode steps
  select what that layer selected. Rows of the embedded real trace by default (the shared code and
  prose traces with ``--trace``), so requests differ as much as real layers do (some saturate at a small buffer, others need a large
  one). The trace's own context length is kept for locality; the drawn prompt length only sets the
  indexer's cost.
"""
from __future__ import annotations

import dataclasses
from typing import List, Sequence

import numpy as np

from .curves import stack_distances

__all__ = ["Request", "LocalityRow", "make_requests", "locality_rows"]


@dataclasses.dataclass
class LocalityRow:
    name: str                      # e.g. "asyncio_32k layer 5"
    selections: np.ndarray         # [steps, K] positions, -1 padding
    context: int
    distances: list                # per step, sorted LRU stack distances (curves.stack_distances)

    @property
    def steps(self) -> int:
        return int(self.selections.shape[0])

    def unique_per_step(self) -> float:
        if not hasattr(self, "_unique"):
            self._unique = float(np.mean([d.size for d in self.distances]))
        return self._unique


@dataclasses.dataclass
class Request:
    rid: int
    arrival_s: float
    prompt: int
    output: int
    row: int                       # index into the locality rows


def locality_rows(traces: Sequence[tuple], layers_per_trace: int, steps: int,
                  progress=None) -> List[LocalityRow]:
    """``traces``: ``(name, Trace)`` pairs; takes ``layers_per_trace`` layers spread over each."""
    rows = []
    for name, tr in traces:
        sel = tr.sel4()
        picks = np.unique(np.linspace(0, tr.layers - 1, min(layers_per_trace, tr.layers)).astype(int))
        for layer in picks:
            s = np.asarray(sel[layer, :steps]).astype(np.int64)
            rows.append(LocalityRow(f"{name} layer {layer}", s.reshape(s.shape[0], -1), tr.T,
                                    stack_distances(s, tr.T)))
            if progress is not None:
                progress.update(1)
    return rows


def make_requests(n: int, rate: float, rows: Sequence[LocalityRow], seed: int = 0,
                  prompt_mean: float = 48 * 1024, output_mean: float = 384) -> List[Request]:
    if n < 1:
        raise ValueError(f"requests: expected >= 1, got {n}")
    if rate <= 0:
        raise ValueError(f"rate: expected > 0 requests per second, got {rate}")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    arrivals -= arrivals[0]

    def lognormal(mean: float, sigma: float, size: int) -> np.ndarray:
        # mean of a log-normal is exp(mu + sigma^2 / 2)
        return rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, size)

    prompts = np.clip(lognormal(prompt_mean, 0.6, n), 8 * 1024, 128 * 1024).astype(int)
    which = rng.integers(0, len(rows), n)
    outputs = lognormal(output_mean, 0.8, n)
    return [Request(i, float(arrivals[i]), int(prompts[i]),
                    int(np.clip(outputs[i], 32, rows[which[i]].steps)), int(which[i]))
            for i in range(n)]
