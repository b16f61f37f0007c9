"""A CPU implementation of the per-layer host LRU of vllm-ascend's sparse KV offload, to time.

``avsg bench decode``'s ``lru-host`` peer matches on the host: per layer, the top-k of every query
token goes D2H, a host callback runs an exact LRU per query-token row over ``topk_buffer_size``
slots, writes two copy descriptors (latent and RoPE part) per miss, and the descriptors go back
H2D. Our own C implementation of that per-row algorithm (learned from the design, no code taken)
is ``lab/host_lru.cpp``, built into the op library by CMake, so that the model's host cost is a
measurement on this machine (scaled to the serving host by a stated factor in the profile).

Per row and call, with ``S`` slots, ``K`` selections and a workspace ``mark``/``where`` of
``max_pos`` ints stamped with an epoch (so nothing is cleared between calls):

1. stamp each selected position with the epoch and remember its selection index;
2. walk the row's slots oldest first: a slot holding a position the speculative suffix made
   invalid (``>= valid_len``) is emptied; a slot holding a selected position is a hit (its slot is
   the answer for that selection); every other slot is evictable, in LRU order;
3. the misses take the oldest evictable slots;
4. the new order is: evictable slots not taken (oldest first), the slots just filled, the hits
   (most recent last);
5. per miss, two descriptors (host address, device address, size) for the latent and RoPE parts.

Work per row is O(S + K): the walk over all slots dominates, whatever the hit rate.
"""
from __future__ import annotations

import ctypes
import time
from typing import Dict, Optional

import numpy as np

_LIB = None


def _library():
    """The implementation in the op library (lab/host_lru.cpp, built by CMake with the ops)."""
    global _LIB
    if _LIB is None:
        from ... import _ops
        lib = ctypes.CDLL(_ops.LIBRARY_PATH)
        try:
            lib.host_lru_rows.restype = ctypes.c_int64
        except AttributeError:
            raise RuntimeError(f"host LRU timing: {_ops.LIBRARY_PATH} has no host_lru_rows; "
                               f"rebuild the package (pip install --no-build-isolation -e .)"
                               ) from None
        _LIB = lib
    return _LIB


class HostLRU:
    """``rows`` query-token rows of ``capacity`` slots each, for selections of ``k`` positions."""

    def __init__(self, rows: int, capacity: int, k: int, max_pos: int, block: int = 128,
                 latent_bytes: int = 1024, rope_bytes: int = 128):
        if capacity < k:
            raise ValueError(f"capacity: expected >= k = {k}, got {capacity}")
        self.rows, self.capacity, self.k, self.max_pos = rows, capacity, k, max_pos
        self.block, self.latent_bytes, self.rope_bytes = block, latent_bytes, rope_bytes
        self.slot_pos = np.full((rows, capacity), -1, np.int32)
        self.order = np.tile(np.arange(capacity, dtype=np.int32), (rows, 1))
        self.mark = np.zeros(max_pos, np.int32)
        self.where = np.zeros(max_pos, np.int32)
        self.epoch = np.zeros(1, np.int32)
        self.scratch = np.zeros(3 * capacity, np.int32)
        self.slot_of = np.zeros((rows, k), np.int32)
        self.misses = np.zeros(rows, np.int32)
        self.desc = np.zeros((rows * k, 6), np.int64)

    def step(self, sel: np.ndarray, valid_len: np.ndarray) -> np.ndarray:
        """One layer's call: ``sel`` int32 [rows, k]; returns the misses per row."""
        sel = np.ascontiguousarray(sel, dtype=np.int32)
        valid_len = np.ascontiguousarray(valid_len, dtype=np.int32)
        if sel.shape != (self.rows, self.k) or valid_len.shape != (self.rows,):
            raise ValueError(f"sel: expected [{self.rows}, {self.k}] and valid_len [{self.rows}]")
        ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        _library().host_lru_rows(
            ctypes.c_int32(self.rows), ctypes.c_int32(self.k), ctypes.c_int32(self.capacity),
            ctypes.c_int32(self.max_pos), ptr(sel), ptr(valid_len), ptr(self.slot_pos),
            ptr(self.order), ptr(self.slot_of), ptr(self.misses), ptr(self.mark), ptr(self.where),
            ptr(self.epoch), ptr(self.scratch), ptr(self.desc), ctypes.c_int32(self.block),
            ctypes.c_int64(self.latent_bytes), ctypes.c_int64(self.rope_bytes))
        return self.misses.copy()


def time_per_row_us(sel: np.ndarray, positions: np.ndarray, capacity: int, max_pos: int,
                    warmup: int = 16, measured: int = 32) -> Dict[str, float]:
    """Median single-thread CPU microseconds per query-token row and call, this machine, on the
    trace's selections (its layers as rows, ``warmup`` steps first so the rows are warm).
    ``sel`` int [layers, steps, K]."""
    rows, steps, k = sel.shape
    if steps < warmup + measured:
        warmup, measured = max(1, steps // 3), max(1, steps - max(1, steps // 3))
    lru = HostLRU(rows, capacity, k, max_pos)
    samples, missed = [], []
    for s in range(warmup + measured):
        valid = np.full(rows, int(positions[s]) + 1, np.int32)
        # CPU time of this thread: the work, not the waits of a shared machine
        t0 = time.thread_time()
        m = lru.step(sel[:, s], valid)
        dt = time.thread_time() - t0
        if s >= warmup:
            samples.append(1e6 * dt / rows)
            missed.append(float(m.mean()))
    return {"us_per_row": float(np.median(samples)), "p10": float(np.percentile(samples, 10)),
            "p90": float(np.percentile(samples, 90)), "misses_per_row": float(np.mean(missed)),
            "rows": rows, "capacity": capacity, "k": k, "calls": measured}


def reference_step(slot_pos: np.ndarray, order: np.ndarray, sel: np.ndarray,
                   valid_len: int) -> Optional[np.ndarray]:
    """Pure-Python statement of one row's step (the test's oracle): returns the slot of each
    selection and updates ``slot_pos``/``order`` in place."""
    S = slot_pos.size
    want = {}
    for i, p in enumerate(sel.tolist()):
        if 0 <= p and p not in want:
            want[p] = i
    out = np.full(sel.size, -1, np.int32)
    hits, evict = [], []
    for slot in order.tolist():
        p = int(slot_pos[slot])
        if p >= valid_len:
            slot_pos[slot] = -1
            p = -1
        if p >= 0 and p in want:
            out[want[p]] = slot
            hits.append(slot)
        else:
            evict.append(slot)
    filled = []
    for p, i in want.items():
        if out[i] < 0 and len(filled) < len(evict):
            slot = evict[len(filled)]
            slot_pos[slot] = p
            out[i] = slot
            filled.append(slot)
    new = evict[len(filled):] + filled + hits
    assert len(new) == S
    order[:] = new
    return out
