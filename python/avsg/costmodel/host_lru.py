"""A CPU implementation of the per-layer host LRU of vllm-ascend's sparse KV offload, to time.

``avsg bench decode``'s ``lru-host`` peer matches on the host: per layer, the top-k of every query
token goes D2H, a host callback runs an exact LRU per query-token row over ``topk_buffer_size``
slots, writes two copy descriptors (latent and RoPE part) per miss, and the descriptors go back
H2D. This module is our own C implementation of that per-row algorithm (learned from the design,
no code taken), compiled with the system C compiler at first use, so that the model's host cost is
a measurement on this machine (scaled to the serving host by a stated factor in the profile).

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
import hashlib
import os
import subprocess
import tempfile
import time
from typing import Dict, Optional

import numpy as np

_SOURCE = r"""
#include <stdint.h>
/* rows x K selections (int32, -1 = none). Per row: slot_pos[S] (position held, -1 empty),
   order[S] (slots, least recently used first). Workspace: mark/where [max_pos], scratch [3 S].
   Out: slot_of[rows x K], misses[rows], descriptors (3 int64 per descriptor, 2 per miss). */
int64_t host_lru_rows(int32_t rows, int32_t K, int32_t S, int32_t max_pos,
                      const int32_t *sel, const int32_t *valid_len,
                      int32_t *slot_pos, int32_t *order, int32_t *slot_of, int32_t *misses,
                      int32_t *mark, int32_t *where, int32_t *epoch, int32_t *scratch,
                      int64_t *desc, int32_t block, int64_t latent_bytes, int64_t rope_bytes) {
  int64_t total = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const int32_t *s = sel + (int64_t)r * K;
    int32_t *sp = slot_pos + (int64_t)r * S, *ord = order + (int64_t)r * S;
    int32_t *out = slot_of + (int64_t)r * K;
    int32_t *hit = scratch, *evict = scratch + S, *filled = scratch + 2 * S;
    int32_t e = ++*epoch, nh = 0, ne = 0, nm = 0;
    for (int32_t i = 0; i < K; ++i) {
      out[i] = -1;
      int32_t p = s[i];
      if (p >= 0 && p < max_pos && mark[p] != e) { mark[p] = e; where[p] = i; }
    }
    for (int32_t j = 0; j < S; ++j) {
      int32_t slot = ord[j], p = sp[slot];
      if (p >= valid_len[r]) { sp[slot] = -1; p = -1; }
      if (p >= 0 && mark[p] == e) { out[where[p]] = slot; hit[nh++] = slot; }
      else evict[ne++] = slot;
    }
    for (int32_t i = 0; i < K && nm < ne; ++i) {
      int32_t p = s[i];
      if (p < 0 || p >= max_pos || out[i] >= 0 || where[p] != i) continue;
      int32_t slot = evict[nm];
      sp[slot] = p; out[i] = slot; filled[nm] = slot;
      int64_t *d = desc + 6 * (total + nm);
      int64_t page = p / block, in_page = p % block;
      d[0] = page * block * latent_bytes + in_page * latent_bytes;
      d[1] = ((int64_t)r * S + slot) * latent_bytes; d[2] = latent_bytes;
      d[3] = page * block * rope_bytes + in_page * rope_bytes;
      d[4] = ((int64_t)r * S + slot) * rope_bytes; d[5] = rope_bytes;
      ++nm;
    }
    int32_t w = 0;
    for (int32_t j = nm; j < ne; ++j) ord[w++] = evict[j];
    for (int32_t j = 0; j < nm; ++j) ord[w++] = filled[j];
    for (int32_t j = 0; j < nh; ++j) ord[w++] = hit[j];
    misses[r] = nm;
    total += nm;
  }
  return total;
}
"""

_LIB = None


def _library():
    """The compiled implementation (cached by source hash in the temp directory)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    digest = hashlib.sha1(_SOURCE.encode()).hexdigest()[:12]
    folder = os.path.join(tempfile.gettempdir(), f"avsg-host-lru-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    so = os.path.join(folder, f"host_lru_{digest}.so")
    if not os.path.exists(so):
        src = os.path.join(folder, f"host_lru_{digest}.c")
        with open(src, "w") as f:
            f.write(_SOURCE)
        compiler = os.environ.get("CC", "cc")
        try:
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", so + ".tmp", src],
                           check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            raise RuntimeError(f"host LRU timing needs a C compiler ({compiler}): {e}") from None
        os.replace(so + ".tmp", so)
    lib = ctypes.CDLL(so)
    lib.host_lru_rows.restype = ctypes.c_int64
    _LIB = lib
    return lib


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
