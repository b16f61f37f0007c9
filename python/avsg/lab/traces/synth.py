"""Synthetic selection traces with the AVSG paper's knobs.

Paper settings: maximum KV length 16K, top-K 2048, adjacent-step similarity ``gamma`` in
{0.5, 0.7, 0.9}, historical recall drawn per step from ``N(mu_hist, 0.01^2)`` clipped to [0, 1]
with ``mu_hist`` in {0.5, 0.7, 0.9}; we add context growth. The paper does not pin the definitions
down, so these are ours (and :func:`measure_gamma` / :func:`measure_recall` measure exactly them, on
synthetic and real traces alike):

* ``S_s`` is the set of ``K`` positions selected at step ``s`` (one layer).
* **Context growth.** Step ``s`` selects from ``[0, n_s)`` with ``n_s = n_0 + s``; the last recorded
  step has ``n = max_len``. The query position of step ``s`` is ``n_s - 1``.
* **Adjacent-step similarity** ``gamma_s = |S_s ∩ S_{s-1}| / K``. The generator keeps exactly
  ``round(gamma*K)`` positions of ``S_{s-1}`` (a uniformly random subset), so the measured value
  equals ``round(gamma*K)/K`` at every step.
* **History** ``H_s = (S_{s-1-W} ∪ ... ∪ S_{s-2}) \\ S_{s-1}``: positions selected in the ``W`` steps
  before the previous one (``W = window``, default 8) but not in the previous step.
* **Historical recall** ``recall_s = |(S_s \\ S_{s-1}) ∩ H_s| / |S_s \\ S_{s-1}|``: of the
  ``m = K - round(gamma*K)`` selections that are new relative to the previous step, the fraction that
  comes back from recent history. The generator draws ``r_s ~ clip(N(mu_hist, sigma^2), 0, 1)``,
  takes ``round(r_s*m)`` positions uniformly from ``H_s`` and the rest uniformly from the *fresh* pool
  ``[0, n_s) \\ (S_{s-1} ∪ ... ∪ S_{s-1-W})`` (which includes the newly grown positions). ``gamma``
  and recall are thus independent knobs (any pair in [0,1]^2 is valid).
* ``W + 1`` warm-up steps are generated first and dropped, so every recorded step has a full history
  window (the first step of the recorded trace is still a warm-up for replay).

Layers are independent draws with the same parameters (one child seed per layer).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .format import Trace, smallest_sel_dtype

__all__ = ["generate", "measure_gamma", "measure_recall"]


def generate(steps: int = 1024, layers: int = 1, k: int = 2048, max_len: int = 16384,
             gamma: float = 0.7, mu_hist: float = 0.7, sigma: float = 0.01, window: int = 8,
             seed: int = 0, progress: Optional[Callable[[int], None]] = None) -> Trace:
    """Generate a synthetic trace ``sel [layers, steps, k]`` (see module docstring).
    ``progress(n)``, when given, is called as the draw advances, ``steps + window + 1`` in all
    per layer (a command's progress bar)."""
    if not (0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma: expected a value in [0, 1], got {gamma}")
    if not (0.0 <= mu_hist <= 1.0):
        raise ValueError(f"mu_hist: expected a value in [0, 1], got {mu_hist}")
    if steps < 1 or layers < 1 or k < 1 or window < 1 or sigma < 0:
        raise ValueError("steps, layers, k, window: expected >= 1; sigma: expected >= 0")
    warm = window + 1
    G = steps + warm
    n0 = max_len - (G - 1)
    if n0 < k:
        raise ValueError(f"max_len: expected >= k + steps + window = {k + G - 1}, got {max_len}")
    a = int(round(gamma * k))
    m = k - a
    children = np.random.SeedSequence(seed).spawn(layers)
    sel = np.empty((layers, steps, k), dtype=smallest_sel_dtype(max_len, padded=False))
    recall = np.zeros((layers, steps))
    for l in range(layers):
        rng = np.random.default_rng(children[l])
        last = np.full(max_len, -(1 << 30), np.int64)  # step each position was last selected
        prev = np.sort(rng.choice(n0, k, replace=False))
        last[prev] = 0
        for g in range(1, G):
            n = n0 + g
            keep = rng.choice(prev, a, replace=False) if a else prev[:0]
            r = float(np.clip(rng.normal(mu_hist, sigma), 0.0, 1.0)) if sigma > 0 else mu_hist
            lastn = last[:n]
            hist = np.flatnonzero((lastn >= g - 1 - window) & (lastn < g - 1))
            b = min(int(round(r * m)), hist.size)
            fresh = np.flatnonzero(lastn < g - 1 - window)
            if fresh.size < m - b:
                raise ValueError(
                    f"max_len {max_len} too small for gamma={gamma}, mu_hist={mu_hist}, window={window}: "
                    f"step {g} needs {m - b} fresh positions, {fresh.size} available")
            take_h = rng.choice(hist, b, replace=False) if b else hist[:0]
            take_f = rng.choice(fresh, m - b, replace=False) if m - b else fresh[:0]
            cur = np.sort(np.concatenate([keep, take_h, take_f]))
            last[cur] = g
            prev = cur
            if g >= warm:
                sel[l, g - warm] = cur
                recall[l, g - warm] = r
            if progress is not None and g % 64 == 0:
                progress(64)
        if progress is not None:
            progress(G - (G - 1) // 64 * 64)       # the rest of this layer's G steps
        if G == 1:  # steps == 1 and no warm-up would be impossible (window >= 1), kept for clarity
            sel[l, 0] = prev
    positions = (n0 + warm + np.arange(steps) - 1).astype(np.int32)
    rule = (f"synthetic (avsg.lab.traces.synth): gamma={gamma}, recall~clip(N({mu_hist},{sigma}^2)), "
            f"window={window}, context grows by 1 per step, max_len={max_len}, seed={seed}")
    extra = {"synth_gamma": np.float64(gamma), "synth_mu_hist": np.float64(mu_hist),
             "synth_sigma": np.float64(sigma), "synth_window": np.int32(window),
             "synth_seed": np.int64(seed), "synth_recall_drawn": recall}
    return Trace(sel, positions, T=int(max_len), k=int(k), model="synthetic", rule=rule, extra=extra)


def _sets(sel: np.ndarray):
    """``sel`` as ``[layers, steps, K']`` int64 with the MTP axis folded (-1 kept as padding)."""
    s = np.asarray(sel)
    if s.ndim == 4:
        s = s.reshape(s.shape[0], s.shape[1], -1)
    return s.astype(np.int64)


def measure_gamma(sel: np.ndarray) -> np.ndarray:
    """Per layer and step ``s >= 1``: ``|S_s ∩ S_{s-1}| / |S_s|`` -> ``[layers, steps-1]``."""
    s = _sets(sel)
    L, N, _ = s.shape
    out = np.zeros((L, max(N - 1, 0)))
    T = int(s.max()) + 2
    for l in range(L):
        mark = np.zeros(T, bool)
        for t in range(N):
            cur = s[l, t][s[l, t] >= 0]
            if t:
                out[l, t - 1] = mark[cur].sum() / max(cur.size, 1)
                mark[:] = False
            mark[cur] = True
    return out


def measure_recall(sel: np.ndarray, window: int = 8) -> np.ndarray:
    """Per layer and step ``s >= window+1``: historical recall as defined in the module docstring
    -> ``[layers, steps-window-1]`` (NaN where no selection is new)."""
    s = _sets(sel)
    L, N, _ = s.shape
    T = int(s.max()) + 2
    first = window + 1
    out = np.full((L, max(N - first, 0)), np.nan)
    for l in range(L):
        last = np.full(T, -(1 << 30), np.int64)
        for t in range(N):
            cur = s[l, t][s[l, t] >= 0]
            if t >= first:
                lc = last[cur]
                new = lc != t - 1
                nn = int(new.sum())
                if nn:
                    out[l, t - first] = ((lc >= t - 1 - window) & new).sum() / nn
            last[cur] = t
    return out
