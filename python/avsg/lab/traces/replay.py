"""The one replay driver every policy goes through.

Counting rules (the same for all policies):

* a *selection* is a unique valid position of one row (layer) in one step (the union over the step's
  ``Tq`` query tokens when the trace has the MTP axis);
* a *hit* is a selection that was resident before the step; everything else is fetched (a miss);
* step 0 only warms the buffer: its selections are fetched but not counted, unless
  ``count_first_step=True``;
* hit rate = hits / selections, summed over the counted steps (and over layers for the overall
  figure).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from .format import Trace
from .policies import Policy, StepInput, make_policy, unique_rows

__all__ = ["ReplayResult", "replay", "replay_many", "DEFAULT_ENTRY_BYTES"]

#: bytes of one KV entry per layer: a DeepSeek-V3.2 MLA latent (512) + RoPE key (64), bf16
DEFAULT_ENTRY_BYTES = 576 * 2


@dataclasses.dataclass
class ReplayResult:
    policy: str
    capacity: int
    hits: np.ndarray        # int64 [rows, steps]
    selections: np.ndarray  # int64 [rows, steps]
    counted: np.ndarray     # bool [steps]
    elapsed: float          # seconds
    bypassed: int = 0
    entry_bytes: int = DEFAULT_ENTRY_BYTES
    description: str = ""
    cost_counters: list = dataclasses.field(default_factory=list)   # counted plan launches

    @property
    def misses_per_row_step(self) -> float:
        c = int(self.counted.sum()) * self.hits.shape[0]
        return (self.total_selections - self.total_hits) / c if c else float("nan")

    @property
    def total_hits(self) -> int:
        return int(self.hits[:, self.counted].sum())

    @property
    def total_selections(self) -> int:
        return int(self.selections[:, self.counted].sum())

    @property
    def hit_rate(self) -> float:
        n = self.total_selections
        return self.total_hits / n if n else float("nan")

    @property
    def per_layer(self) -> np.ndarray:
        h = self.hits[:, self.counted].sum(1)
        n = self.selections[:, self.counted].sum(1)
        return h / np.maximum(n, 1)

    @property
    def misses_per_step(self) -> float:
        """Fetched entries per counted step, summed over rows (layers)."""
        c = int(self.counted.sum())
        return (self.total_selections - self.total_hits) / c if c else float("nan")

    @property
    def bytes_per_step(self) -> float:
        return self.misses_per_step * self.entry_bytes

    def to_dict(self) -> Dict:
        pl = self.per_layer
        return {
            "policy": self.policy, "description": self.description, "capacity": self.capacity,
            "hit_rate": self.hit_rate, "hits": self.total_hits, "selections": self.total_selections,
            "counted_steps": int(self.counted.sum()), "misses_per_step": self.misses_per_step,
            "bytes_per_step": self.bytes_per_step, "entry_bytes": self.entry_bytes,
            "per_layer": [float(x) for x in pl],
            "per_layer_min": float(pl.min()), "per_layer_max": float(pl.max()),
            "bypassed": self.bypassed, "elapsed_s": self.elapsed,
            "misses_per_row_step": self.misses_per_row_step,
        }


def _seq_lens(tr: Trace, s: int, rows: int) -> np.ndarray:
    p = tr.positions2()[s]
    return np.full(rows, int(np.max(p)) + 1, np.int64)


def replay(trace: Trace, policy: Union[str, Policy], capacity: Optional[int] = None,
           count_first_step: bool = False, entry_bytes: int = DEFAULT_ENTRY_BYTES,
           progress: bool = False, **opts) -> ReplayResult:
    """Replay ``trace`` (all layers, one buffer row per layer) through ``policy``.

    ``policy`` is a name from :data:`avsg.lab.traces.policies.POLICIES` (then ``capacity`` is required and
    ``opts`` go to :func:`make_policy`) or a ready :class:`Policy` with ``rows == trace.layers``.
    """
    sel4 = trace.sel4()
    rows, steps, Tq, K = sel4.shape
    if isinstance(policy, str):
        if capacity is None:
            raise ValueError("capacity: required when the policy is given by name")
        pol = make_policy(policy, rows, capacity, K, Tq, max_pos=trace.T, **opts)
    else:
        pol = policy
        if pol.rows != rows:
            raise ValueError(f"policy rows: expected {rows} (trace layers), got {pol.rows}")
    t0 = time.perf_counter()
    pol.prepare(sel4)
    hits = np.zeros((rows, steps), np.int64)
    nsel = np.zeros((rows, steps), np.int64)
    for s in range(steps):
        raw = sel4[:, s].astype(np.int64)  # unsigned traces carry no -1 padding
        u, cnt = unique_rows(raw)
        inp = StepInput(raw, u, cnt, _seq_lens(trace, s, rows))
        hits[:, s] = pol.step(s, inp)
        nsel[:, s] = cnt
        if progress and (s + 1) % 128 == 0:
            print(f"  {pol.name}: step {s + 1}/{steps} ({time.perf_counter() - t0:.1f}s)", flush=True)
    elapsed = time.perf_counter() - t0
    counted = np.ones(steps, bool)
    if not count_first_step:
        counted[0] = False
    return ReplayResult(pol.name, pol.capacity, hits, nsel, counted, elapsed,
                        bypassed=pol.bypassed, entry_bytes=entry_bytes, description=pol.describe(),
                        cost_counters=list(getattr(pol, "cost_samples", [])))


def replay_many(trace: Trace, policies: Sequence[str], capacities: Sequence[int],
                count_first_step: bool = False, entry_bytes: int = DEFAULT_ENTRY_BYTES,
                progress: bool = False, log=print, **opts) -> List[ReplayResult]:
    """Replay every (policy, capacity) pair; ``log`` gets one line per finished replay."""
    out = []
    for cap in capacities:
        for name in policies:
            r = replay(trace, name, cap, count_first_step=count_first_step, entry_bytes=entry_bytes,
                       progress=progress, **opts)
            if log:
                log(f"{name:>14s} C={cap:<6d} hit {100 * r.hit_rate:6.2f}%  ({r.elapsed:.1f}s)")
            out.append(r)
    return out
