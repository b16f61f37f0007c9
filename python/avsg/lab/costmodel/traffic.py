"""Copy traffic per mode, measured by replaying a selection trace over every layer (MTP-n: 1 + n
query tokens, simulated acceptance, rejected drafts invalidated). The first iteration warms the
buffers and is not counted; the result is rows per request, layer and iteration, per trace layer.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import numpy as np

from ..traces.lookup import TraceInputError, read_trace, trace_label


# ---------------------------------------------------------------- traffic, over every layer

@dataclasses.dataclass
class Traffic:
    """Measured per iteration (1 + drafts query tokens) and per request: rows each mode copies,
    per trace layer (``rows[mode]`` float [layers])."""
    drafts: int
    accept_mean: float
    tokens_per_iteration: float
    capacity: int
    topk_buffer: int
    rows: Dict[str, List[float]]
    source: str
    # the fused path's per row-step work by regime (fused.summarize), per variant
    fused: Dict[str, Dict[str, Dict[str, float]]] = dataclasses.field(default_factory=dict)

    def mean(self, mode: str) -> float:
        return float(np.mean(self.rows[mode])) if self.rows.get(mode) else 0.0

    def spread(self, mode: str) -> Dict[str, float]:
        r = np.asarray(self.rows[mode], float)
        return {"min": float(r.min()), "p50": float(np.median(r)), "max": float(r.max())}


def load_trace_cut(trace_path: str, layers: Optional[int], steps: Optional[int], min_steps: int = 0,
                   default_steps: int = 256):
    """The first ``layers`` x ``steps`` of a trace, their values checked (one-line errors).
    ``steps`` None: ``default_steps``, or all of a shorter trace; a value given is refused when
    the trace is shorter."""
    from ..traces.format import TraceFormatError, validate_trace
    trace = read_trace("--trace", trace_path, check_values=False)
    if trace.has_mtp_axis:
        raise TraceInputError(f"--trace: {trace_path} has an MTP axis; expected sel [layers, steps, k]")
    if trace.steps < min_steps:
        raise TraceInputError(f"--trace: {trace_path} has {trace.steps} steps; the counted plan needs "
                         f"at least {min_steps} (warm-up and measured launches)")
    if layers is not None and layers > trace.layers:
        raise TraceInputError(f"--trace-layers: {trace_path} has {trace.layers} layers, asked for "
                              f"{layers}")
    if steps is None:
        steps = min(default_steps, trace.steps)
    elif steps > trace.steps:
        raise TraceInputError(f"--trace-steps: {trace_path} has {trace.steps} steps, asked for "
                              f"{steps}")
    trace = trace.subset(layers=slice(0, layers), steps=slice(0, steps))
    try:
        validate_trace(trace)
    except TraceFormatError as e:
        raise TraceInputError(f"--trace: {trace_path}: {e}") from None
    return trace



def measure_traffic(trace_path: str, drafts: int, accept_mean: float, capacity: int,
                    topk_buffer: int, steps: int, layers: Optional[int] = None) -> Traffic:
    """One MTP replay of the trace's first ``steps`` steps over all its layers (or ``layers``),
    every mode on the same schedule of accepted drafts; the first iteration warms the buffers and
    is not counted.

    The fused path (:mod:`.fused`): ``fused-2048`` replays the merged kernel's selection cache,
    one row of K slots per query token, exactly (no drop of rejected drafts' positions: the
    kernel has none; hits on rewritten bytes are counted apart as ``stale_hits``);
    ``fused-4096`` is the same path with ``topk_buffer`` slots per query token, an exact LRU per
    token, whose copies are ``lru-host``'s replay (the same per-token LRU, rejected drafts
    dropped)."""
    from ..traces import format as trace_format
    from ..traces.mtp import draw_accepted
    from ... import reference
    from ..traces.policies import OP_POLICY, SlotMapFIFO, StepInput, make_policy, unique_rows
    from ... import backend
    from . import fused
    trace = trace_format.load_trace(trace_path, check_values=False)
    sel = trace.sel[:layers, :steps] if layers else trace.sel[:, :steps]
    L, N, K = sel.shape
    Tq = 1 + drafts
    pos = np.asarray(trace.positions[:steps]).astype(np.int64)
    if N < Tq + 1:
        raise ValueError(f"trace: expected at least {Tq + 1} steps, got {N}")
    max_pos = int(trace.T) + 8
    pols = {"avsg": make_policy(OP_POLICY[reference.DEFAULT_POLICY], L, capacity, K, Tq,
                                max_pos=max_pos),
            "lru-device": make_policy("lru", L, capacity, K, Tq, max_pos=max_pos),
            "slotmap-device": SlotMapFIFO(L, capacity, K, Tq, max_pos),
            "lru-host": make_policy("lru", L * Tq, topk_buffer, K, 1, max_pos=max_pos)}
    rows = {m: np.zeros(L) for m in ("offload", *pols, "fused-2048")}
    selection = fused.SelectionCache(L * Tq, K)
    last_write = np.full(max_pos, -1, np.int64)
    fused_steps: Dict[str, list] = {"fused-2048": [], "fused-4096": []}
    accepted = draw_accepted(N, drafts, accept_mean if drafts else 0.0)
    s, i, counted, emitted = 0, 0, 0, 0
    with backend.emulation("fast"):
        while s + drafts < N:
            a = int(accepted[i])
            raw = sel[:, s:s + Tq].astype(np.int64)
            seq = np.full(L, pos[s + drafts] + 1, np.int64)
            valid_len = pos[s] + 1 + a
            u, cnt = unique_rows(raw)
            got = {"offload": cnt.astype(float)}
            for name in ("avsg", "lru-device", "slotmap-device"):
                h = pols[name].step(i, StepInput(raw, u, cnt, seq))
                got[name] = (cnt - h).astype(float)
                pols[name].invalidate(np.full(L, valid_len, np.int64))
            raw1 = raw.reshape(L * Tq, 1, K)
            u1, c1 = unique_rows(raw1)
            h1 = pols["lru-host"].step(i, StepInput(raw1, u1, c1, np.full(L * Tq, seq[0])))
            got["lru-host"] = (c1 - h1).reshape(L, Tq).sum(1).astype(float)
            pols["lru-host"].invalidate(np.full(L * Tq, valid_len, np.int64))
            last_write[pos[s:s + Tq]] = i          # this pass writes its query tokens' KV
            f = selection.step(raw1.reshape(L * Tq, K), last_write, i)
            got["fused-2048"] = f.misses.reshape(L, Tq).sum(1).astype(float)
            if i > 0:
                m1 = (c1 - h1).astype(np.int64)
                fused_steps["fused-2048"].append(f)
                fused_steps["fused-4096"].append(fused.RowSteps(
                    misses=m1, merge_steps=topk_buffer + m1, scan=np.full_like(m1, topk_buffer),
                    probe=np.ones_like(m1), same=np.zeros(m1.shape, bool),
                    stale_hits=np.zeros_like(m1)))
                for m in rows:
                    rows[m] += got[m]
                counted += 1
                emitted += 1 + a
            s += 1 + a
            i += 1
    if not counted:
        raise ValueError(f"trace: {N} steps give no counted iteration at MTP-{drafts}")
    rows["fused-4096"] = rows["lru-host"]
    return Traffic(drafts, accept_mean, emitted / counted, capacity, topk_buffer,
                   {m: (v / counted).tolist() for m, v in rows.items()},
                   f"{trace_label(trace_path)}: all {L} layers x {counted} iterations",
                   {v: fused.summarize(steps) for v, steps in fused_steps.items()})
