"""Multi-token-prediction (MTP) replay of a single-query trace.

A decode *iteration* runs ``1 + n`` query tokens (the verified token plus ``n`` drafts). With teacher
forcing the drafts' selections are the selections of the next positions, so iteration ``i`` starting
at trace step ``s_i`` uses steps ``s_i .. s_i + n`` as its ``Tq = 1 + n`` query tokens. The verifier
accepts ``a_i`` drafts (``0 <= a_i <= n``) drawn from an acceptance model; the iteration emits
``1 + a_i`` tokens, the next one starts at ``s_{i+1} = s_i + 1 + a_i``, and the speculative positions
beyond the accepted ones are invalidated in the buffer (``valid_len = positions[s_i] + 1 + a_i``), so
they can never produce a false hit.

Acceptance models (``accept_mean`` = expected number of accepted drafts, e.g. 1.44 of 3):

* ``geometric``: draft ``j`` is accepted with probability ``p`` if all earlier drafts were;
  ``p`` solves ``p + p^2 + ... + p^n = accept_mean``.
* ``fixed``: deterministic, ``a_i = floor((i+1)*mean) - floor(i*mean)`` (the running mean is exact).

Buffer organisations compared (same policy, same capacity per buffer, same counting rules):

* ``shared``: one buffer per layer serves all ``Tq`` tokens (the AVSG design); an entry needed by
  several tokens is fetched once;
* ``separate``: one buffer per layer *and* token slot (``Tq`` times the memory); token ``t`` of every
  iteration uses buffer ``t``; shared entries are fetched once per token;
* ``cold``: no reuse across iterations (the buffer starts empty every iteration); entries shared by
  the tokens of one iteration are fetched once;
* ``offload``: no reuse at all: every selection of every token is fetched.

Reported per mode: fetched entries per iteration and per emitted token (summed over layers), and the
reuse rate ``1 - fetched / demanded`` where ``demanded`` counts each token's selections separately.
The first iteration warms the buffers and is not counted (unless ``count_first_step``).
"""
from __future__ import annotations

import time
from typing import Dict, Sequence

import numpy as np

from .format import Trace
from .policies import StepInput, make_policy, unique_rows

__all__ = ["acceptance_probability", "draw_accepted", "mtp_replay", "MODES"]

MODES = ("shared", "separate", "cold", "offload")


def acceptance_probability(drafts: int, accept_mean: float) -> float:
    """``p`` with ``sum_{j=1..drafts} p^j = accept_mean`` (bisection)."""
    if not (0.0 <= accept_mean <= drafts):
        raise ValueError(f"accept_mean: expected a value in [0, drafts={drafts}], got {accept_mean}")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if sum(mid ** j for j in range(1, drafts + 1)) < accept_mean:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def draw_accepted(iterations: int, drafts: int, accept_mean: float, model: str = "geometric",
                  seed: int = 0) -> np.ndarray:
    """Accepted draft counts for ``iterations`` iterations (int64 array)."""
    if model == "geometric":
        p = acceptance_probability(drafts, accept_mean)
        rng = np.random.default_rng(seed)
        acc = rng.random((iterations, drafts)) < p
        return np.cumprod(acc, axis=1).sum(1).astype(np.int64)
    if model == "fixed":
        if not (0.0 <= accept_mean <= drafts):
            raise ValueError(f"accept_mean: expected a value in [0, drafts={drafts}], got {accept_mean}")
        i = np.arange(iterations + 1)
        return np.diff(np.floor(i * accept_mean)).astype(np.int64)
    raise ValueError(f"accept_model: expected 'geometric' or 'fixed', got {model!r}")


def mtp_replay(trace: Trace, policy: str = "lru", capacity: int = 8192, drafts: int = 3,
               accept_mean: float = 1.44, accept_model: str = "geometric", seed: int = 0,
               modes: Sequence[str] = MODES, count_first_step: bool = False, **opts) -> Dict:
    """Replay ``trace`` (no MTP axis) as MTP iterations; returns a JSON-able dict (see module doc)."""
    if trace.has_mtp_axis:
        raise ValueError("trace: expected sel [layers, steps, K] (one query per step) for MTP replay")
    for m in modes:
        if m not in MODES:
            raise ValueError(f"modes: expected a subset of {MODES}, got {m!r}")
    Tq = 1 + drafts
    L, N, K = trace.sel.shape
    if N < Tq:
        raise ValueError(f"trace: expected at least 1+drafts = {Tq} steps, got {N}")
    # schedule: iteration starts and accepted counts
    acc_all = draw_accepted(N, drafts, accept_mean, accept_model, seed)
    starts, accs = [], []
    s0 = 0
    for a in acc_all:
        if s0 + drafts >= N:
            break
        starts.append(s0)
        accs.append(int(a))
        s0 += 1 + int(a)
    starts, accs = np.array(starts), np.array(accs)
    pos = np.asarray(trace.positions).astype(np.int64)
    sel = trace.sel
    counted = np.ones(len(starts), bool)
    if not count_first_step:
        counted[0] = False
    pols = {}
    if "shared" in modes:
        pols["shared"] = make_policy(policy, L, capacity, K, Tq, max_pos=trace.T, **opts)
    if "separate" in modes:
        pols["separate"] = make_policy(policy, L * Tq, capacity, K, 1, max_pos=trace.T, **opts)
    fetched = {m: np.zeros(len(starts), np.int64) for m in modes}
    demanded = np.zeros(len(starts), np.int64)
    t0 = time.perf_counter()
    for i, (s, a) in enumerate(zip(starts, accs)):
        raw = sel[:, s:s + Tq].astype(np.int64)                  # [L, Tq, K]
        per_tok = (raw >= 0).sum()
        demanded[i] = per_tok
        seq = np.full(L, pos[s + drafts] + 1, np.int64)
        valid_len = pos[s] + 1 + a
        u, cnt = unique_rows(raw)
        if "shared" in pols:
            p = pols["shared"]
            h = p.step(i, StepInput(raw, u, cnt, seq))
            fetched["shared"][i] = int((cnt - h).sum())
            p.invalidate(np.full(L, valid_len, np.int64))
        if "separate" in pols:
            p = pols["separate"]
            raw1 = raw.reshape(L * Tq, 1, K)
            u1, c1 = unique_rows(raw1)
            h = p.step(i, StepInput(raw1, u1, c1, np.full(L * Tq, seq[0], np.int64)))
            fetched["separate"][i] = int((c1 - h).sum())
            p.invalidate(np.full(L * Tq, valid_len, np.int64))
        if "cold" in modes:
            fetched["cold"][i] = int(cnt.sum())
        if "offload" in modes:
            fetched["offload"][i] = int(per_tok)
    elapsed = time.perf_counter() - t0
    emitted = int((1 + accs[counted]).sum())
    dem = int(demanded[counted].sum())
    out = {"policy": policy, "capacity": capacity, "drafts": drafts, "accept_mean": accept_mean,
           "accept_model": accept_model, "seed": seed, "iterations": int(counted.sum()),
           "mean_accepted": float(accs[counted].mean()) if counted.any() else float("nan"),
           "emitted_tokens": emitted, "demanded": dem, "elapsed_s": elapsed, "modes": {}}
    for m in modes:
        f = int(fetched[m][counted].sum())
        out["modes"][m] = {"fetched": f, "fetched_per_iteration": f / max(int(counted.sum()), 1),
                           "fetched_per_token": f / max(emitted, 1),
                           "reuse_rate": 1.0 - f / dem if dem else float("nan")}
    return out


def format_mtp(res: Dict) -> str:
    lines = [f"MTP replay: policy={res['policy']} capacity={res['capacity']} drafts={res['drafts']} "
             f"accept={res['accept_model']}(mean {res['accept_mean']}; drawn {res['mean_accepted']:.3f}) "
             f"iterations={res['iterations']} tokens={res['emitted_tokens']} ({res['elapsed_s']:.1f}s)",
             f"{'mode':<10s} {'fetched/iter':>13s} {'fetched/token':>14s} {'reuse':>8s}"]
    for m, v in res["modes"].items():
        lines.append(f"{m:<10s} {v['fetched_per_iteration']:13.1f} {v['fetched_per_token']:14.1f} "
                     f"{100 * v['reuse_rate']:7.2f}%")
    return "\n".join(lines)
