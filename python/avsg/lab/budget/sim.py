"""The serving simulation behind ``avsg serve-sim``: decode iterations of a continuous batch under a
device-memory budget for the KV buffers, per scheduler variant.

Per iteration every running request decodes one token (MTP off). Its buffer is modelled as exact
LRU at its current capacity from its locality row's stack distances (:class:`curves.ElasticLRU`:
exact under any sequence of resizes). The iteration's time comes from the decode model of
``avsg bench decode`` on the hardware profile, per layer: the indexer scan over the batch's context
and plan (``pre``; plan's cost per row is the kernel's counted work, passed in), the gather of the batch's misses over the host link (``gather``), sparse MLA and
the layer's weights (``post``); with two micro-batches, :func:`microbatch.schedule` overlaps them.

Device memory per card: the weights (per the profile's format, experts spread over the cards),
the activations reserve, the buffer budget ``buffer_gb`` and the indexer keys of every running
request (``L x context`` rows, on the device in every design). Every variant admits a request only
while its indexer keys, at its final length, fit in what the rest leaves of the card's HBM.

Variants (all get the same arrivals and the same budget of buffer slots):

``fixed``           every request gets ``fixed_capacity`` slots; admitted while they fit.
``spin``            Spin's fixed ratio: ``spin_ratio x T x K`` slots per request.
``elastic``         admitted while every request keeps its mandatory ``T x K``; the budget split by
                    :func:`split.utility_split` over *online* miss curves (sampled ghost tags,
                    :class:`curves.SampledCurve`), rebalanced on admit/finish and every
                    ``rebalance_every`` iterations. A request with too little history uses the mean
                    curve of the others.
``elastic-oracle``  the same with each request's exact whole-run curve: the cost of estimating online.

With ``tpot_slo_ms`` every variant also stops admitting when the projected step time (the last
iteration's mean misses per request, the newcomers' contexts) would exceed the SLO.

Left out: prefill, MTP, the residency policy's difference from LRU (``reuse`` hits more than exact
LRU on the shared traces, the default ``lifetime`` a little less), kernel launch and host overheads, and queueing on a link shared
between cards.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..costmodel import hardware
from . import microbatch, split
from .curves import ElasticLRU, SampledCurve
from .workload import LocalityRow, Request

__all__ = ["SimConfig", "CostModel", "simulate", "VARIANTS"]

VARIANTS = ("fixed", "spin", "elastic", "elastic-oracle")


@dataclasses.dataclass
class SimConfig:
    buffer_gb: float = 8.0          # device memory for the KV buffers (+ their state), all layers
    max_batch: int = 64             # requests a card decodes at once (compute/activation limit)
    granule: int = 512              # capacity step of the elastic split (slots)
    max_capacity: int = 32768       # the largest buffer a request may get (its allocated S)
    fixed_capacity: int = 16384
    spin_ratio: float = 4.0
    rebalance_every: int = 32
    sample_rate: float = 1 / 16
    warmup_steps: int = 32          # history before a request's own curve is trusted
    tpot_slo_ms: float = 0.0        # > 0: admit only while the projected step time stays within
    microbatch: str = "none"        # none | arrival | cmr
    order: str = "static"           # static | ofms (two micro-batches only)
    cards: int = 32                 # cards serving the model (experts spread): sets the weights per card


class CostModel:
    """Per-layer task times of one decode iteration (seconds), DeepSeek-V3.2 on a hardware profile."""

    def __init__(self, model_config, hw: hardware.Profile, cards: int, plan_us_per_row: float):
        from ..costmodel import projection
        self.c, self.hw, self.cards = model_config, hw, cards
        self.L = model_config.num_hidden_layers
        self.K = model_config.index_topk
        self.plan_us_per_row = float(plan_us_per_row)
        self.fmt = projection.kv_format(hw)
        self._weights_bytes = projection.weights_read_bytes
        self._bits = 8 if self.fmt.name == "fp8" else 16
        kv_layers = model_config.num_hidden_layers + model_config.num_nextn_predict_layers
        self.index_bytes_per_token = kv_layers * self.fmt.index_row_bytes
        self.weights_bytes = projection.weights_per_card(model_config, cards,
                                                     hw["weight_bytes_per_param"])
        self.reserve_bytes = hw["activation_reserve_bytes"]

    def index_budget_bytes(self, buffer_gb: float) -> float:
        """HBM left for indexer keys on one card: all of it minus weights, activations reserve
        and the buffer budget."""
        return self.hw["hbm_bytes"] - self.weights_bytes - self.reserve_bytes - buffer_gb * 1e9

    def tasks(self, tokens: int, context_sum: int, miss_rows: float):
        """(pre, gather, post) per layer for a micro-batch of ``tokens`` requests."""
        c, hw = self.c, self.hw
        if tokens == 0:
            return 0.0, 0.0, 0.0
        weights = sum(self._weights_bytes(c, tokens, self.cards,
                                          hw["weight_bytes_per_param"]).values()) / self.L
        index_s = max(hardware.hbm_time_s(hw, context_sum * self.fmt.index_row_bytes),
                      hardware.cube_time_s(hw, 2 * context_sum * c.index_n_heads
                                           * c.index_head_dim, self._bits))
        plan_s = math.ceil(tokens / hw["aiv_cores"]) * self.plan_us_per_row * 1e-6
        mla_s = max(hardware.hbm_time_s(hw, tokens * self.K * self.fmt.row_bytes),
                    hardware.cube_time_s(hw, 2 * tokens * self.K * c.num_attention_heads
                                         * (2 * c.kv_lora_rank + c.qk_rope_head_dim), 16))
        gather_s = hardware.link_time_s(hw, miss_rows, self.fmt.row_bytes)
        return index_s + plan_s, gather_s, mla_s + hardware.hbm_time_s(hw, weights)

    def step_s(self, contexts: Sequence[int], misses: Sequence[float], mode: str = "none",
               order: str = "static") -> float:
        n = len(contexts)
        if mode == "none" or n < 2:
            parts = [list(range(n))]
        elif mode == "cmr":
            parts = list(microbatch.cmr_split(contexts))
        elif mode == "arrival":
            parts = list(microbatch.arrival_split(n))
        else:
            raise ValueError(f"microbatch: expected none, arrival or cmr, got {mode!r}")
        pre, gather, post = [], [], []
        for p in parts:
            a, g, b = self.tasks(len(p), sum(contexts[i] for i in p), sum(misses[i] for i in p))
            pre.append(a)
            gather.append(g)
            post.append(b)
        if len(parts) == 1:                 # one batch: nothing overlaps
            return self.L * (pre[0] + gather[0] + post[0])
        return microbatch.schedule(self.L, pre, gather, post, order)

    def bytes_per_slot(self) -> int:
        """Buffer bytes one slot costs across the model's layers."""
        from ..costmodel.projection import OP_STATE_BYTES_PER_SLOT
        return self.L * (self.fmt.row_bytes + OP_STATE_BYTES_PER_SLOT)


@dataclasses.dataclass
class _Running:
    req: Request
    lru: ElasticLRU
    capacity: int
    step: int = 0
    elapsed_s: float = 0.0
    admitted_s: float = 0.0


def _capacity_grid(cfg: SimConfig, mandatory: int, row: LocalityRow) -> np.ndarray:
    top = max(mandatory, min(cfg.max_capacity, row.context))
    return mandatory + cfg.granule * np.arange((top - mandatory) // cfg.granule + 1)


def online_curves(rows: Sequence[LocalityRow], cfg: SimConfig, mandatory: int) -> List[np.ndarray]:
    """Per row, the sampled estimate of the hit rate over its capacity grid after every step."""
    out = []
    for row in rows:
        grid = _capacity_grid(cfg, mandatory, row)
        est = SampledCurve(row.context, rate=cfg.sample_rate, max_capacity=int(grid[-1]))
        snaps = np.empty((row.steps, grid.size))
        for j in range(row.steps):
            est.update(row.selections[j])
            snaps[j] = est.hit_rate(grid)
        out.append(snaps)
    return out


def exact_curves(rows: Sequence[LocalityRow], cfg: SimConfig, mandatory: int) -> List[np.ndarray]:
    """Per row, the exact steady-state LRU hit rate over its capacity grid, over the whole row."""
    out = []
    for row in rows:
        grid = _capacity_grid(cfg, mandatory, row)
        d = np.concatenate(row.distances)
        d = np.sort(d)
        out.append(np.searchsorted(d, grid, side="left") / max(1, d.size))
    return out


def simulate(variant: str, requests: Sequence[Request], rows: Sequence[LocalityRow],
             cost: CostModel, cfg: SimConfig, curves: Optional[Dict[str, List[np.ndarray]]] = None,
             progress=None, record_batches: bool = False) -> Dict:
    """Run the variant to the last request's end; returns the metrics and per-iteration series
    (with ``record_batches``, also every iteration's contexts and misses per request)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {', '.join(VARIANTS)}, got {variant!r}")
    K = cost.K
    mandatory = K
    slot_budget = int(cfg.buffer_gb * 1e9 // cost.bytes_per_slot())
    if slot_budget < mandatory:
        raise ValueError(f"buffer_gb: {cfg.buffer_gb} GB holds {slot_budget} slots per layer, "
                         f"fewer than one request's mandatory {mandatory}")
    index_budget = cost.index_budget_bytes(cfg.buffer_gb)
    if index_budget <= 0:
        raise ValueError(f"buffer_gb: {cfg.buffer_gb} GB of buffers + {cost.weights_bytes / 1e9:.1f} "
                         f"GB of weights + {cost.reserve_bytes / 1e9:.1f} GB of activations exceed "
                         f"the card's {cost.hw['hbm_bytes'] / 1e9:.0f} GB")
    index_final = lambda req: (req.prompt + req.output) * cost.index_bytes_per_token  # noqa: E731
    too_long = [r for r in requests if index_final(r) > index_budget]
    if too_long:
        raise ValueError(f"buffer_gb: request {too_long[0].rid}'s indexer keys "
                         f"({index_final(too_long[0]) / 1e9:.2f} GB) exceed the {index_budget / 1e9:.2f} "
                         f"GB the card has left for them")
    fixed = {"fixed": cfg.fixed_capacity, "spin": int(cfg.spin_ratio * mandatory)}.get(variant)
    if fixed is not None and not mandatory <= fixed <= slot_budget:
        raise ValueError(f"capacity: {variant} gives {fixed} slots per request, outside "
                         f"[{mandatory} (mandatory), {slot_budget} (the budget)]")
    if variant.startswith("elastic"):
        key = "exact" if variant == "elastic-oracle" else "online"
        if curves is None or key not in curves:
            curves = dict(curves or {})
            curves[key] = (exact_curves if key == "exact" else online_curves)(rows, cfg, mandatory)
        table = curves[key]
    pending = sorted(requests, key=lambda r: r.arrival_s)
    queue: List[Request] = []
    running: List[_Running] = []
    t = pending[0].arrival_s if pending else 0.0
    t0 = t
    nxt = 0
    it = 0
    changed = True
    finished: List[Dict] = []
    series = {"t": [], "batch": [], "slots": [], "hit_rate": [], "step_s": [], "index_gb": []}
    batches = []
    hits_total = lookups_total = 0
    last_misses = float(mandatory)      # before any step: assume everything misses
    slot_time = batch_time = 0.0
    while nxt < len(pending) or queue or running:
        while nxt < len(pending) and pending[nxt].arrival_s <= t:
            queue.append(pending[nxt])
            nxt += 1
        if not running and not queue:
            t = pending[nxt].arrival_s
            continue
        if fixed is not None:
            n = split.admit([fixed] * len(running), [fixed] * len(queue), slot_budget, cfg.max_batch)
            cap_new = fixed
        else:
            n = split.admit([mandatory] * len(running), [mandatory] * len(queue), slot_budget,
                            cfg.max_batch)
            cap_new = mandatory
        held = sum(index_final(r.req) for r in running)
        fit = 0
        while fit < n and held + index_final(queue[fit]) <= index_budget:
            held += index_final(queue[fit])
            fit += 1
        n = fit
        if cfg.tpot_slo_ms > 0:
            n = _within_slo(n, running, queue, cost, cfg, last_misses)
        for r in queue[:n]:
            running.append(_Running(r, ElasticLRU(), cap_new, admitted_s=t))
        del queue[:n]
        changed = changed or n > 0
        if fixed is None and (changed or it % cfg.rebalance_every == 0):
            _rebalance(running, table, rows, cfg, mandatory, slot_budget, variant)
        changed = False
        contexts, misses = [], []
        step_hits = step_lookups = 0
        for r in running:
            d = rows[r.req.row].distances[r.step]
            hits = r.lru.step(d, r.capacity)
            contexts.append(r.req.prompt + r.step)
            misses.append(float(d.size - hits))
            step_hits += hits
            step_lookups += d.size
        dt = cost.step_s(contexts, misses, cfg.microbatch, cfg.order)
        last_misses = float(np.mean(misses)) if misses else last_misses
        if record_batches:
            batches.append((contexts, misses))
        slots = sum(r.capacity for r in running)
        series["t"].append(t - t0)
        series["batch"].append(len(running))
        series["slots"].append(slots)
        series["hit_rate"].append(step_hits / max(1, step_lookups))
        series["step_s"].append(dt)
        series["index_gb"].append(sum(c * cost.index_bytes_per_token for c in contexts) / 1e9)
        hits_total += step_hits
        lookups_total += step_lookups
        slot_time += slots * dt
        batch_time += len(running) * dt
        t += dt
        it += 1
        still = []
        for r in running:
            r.step += 1
            r.elapsed_s += dt
            if r.step >= r.req.output:
                finished.append({"rid": r.req.rid, "tpot_s": r.elapsed_s / r.req.output,
                                 "wait_s": r.admitted_s - r.req.arrival_s, "tokens": r.req.output})
                changed = True
                if progress is not None:
                    progress.update(1)
            else:
                still.append(r)
        running = still
    span = max(t - t0, 1e-12)
    tokens = sum(f["tokens"] for f in finished)
    tpot = np.array([f["tpot_s"] for f in finished])
    wait = np.array([f["wait_s"] for f in finished])
    buffer_gb_used = slot_time / span * cost.bytes_per_slot() / 1e9
    return {"variant": variant, "requests": len(finished), "tokens": tokens, "span_s": span,
            "tokens_per_s": tokens / span, "tpot_p50_ms": 1e3 * float(np.percentile(tpot, 50)),
            "tpot_p99_ms": 1e3 * float(np.percentile(tpot, 99)),
            "wait_p50_s": float(np.percentile(wait, 50)),
            "concurrency": batch_time / span, "buffer_gb_used": buffer_gb_used,
            "buffer_gb": cfg.buffer_gb, "hit_rate": hits_total / max(1, lookups_total),
            "hits_per_step_per_gb": hits_total / max(1, it) / max(1e-12, buffer_gb_used),
            "slot_budget": slot_budget, "iterations": it, "series": series,
            "index_gb_budget": index_budget / 1e9,
            "index_gb_peak": max(series["index_gb"], default=0.0),
            **({"batches": batches} if record_batches else {})}


def microbatch_projection(batches: Sequence[tuple], cost: CostModel, mode: str,
                          order: str) -> float:
    """Total decode time of the recorded iterations (same batches, same misses) with ``mode``."""
    return float(sum(cost.step_s(c, m, mode, order) for c, m in batches))


def _within_slo(n: int, running: List[_Running], queue: List[Request], cost: CostModel,
                cfg: SimConfig, misses_per_request: float) -> int:
    """How many of the ``n`` admissible requests keep the projected step time within the SLO,
    projected with the last iteration's mean misses per request (at least one runs)."""
    contexts = [r.req.prompt + r.step for r in running]
    ok = 0
    for q in queue[:n]:
        contexts.append(q.prompt)
        step = cost.step_s(contexts, [misses_per_request] * len(contexts), cfg.microbatch, cfg.order)
        if 1e3 * step > cfg.tpot_slo_ms and (running or ok):
            break
        ok += 1
    return ok


def _rebalance(running: List[_Running], table: List[np.ndarray], rows: Sequence[LocalityRow],
               cfg: SimConfig, mandatory: int, slot_budget: int, variant: str) -> None:
    if not running:
        return
    online = variant == "elastic"
    est = []
    for r in running:
        t = table[r.req.row]
        # online: what the ghost tags have seen before this step (nothing at step 0)
        est.append((t[min(r.step, t.shape[0]) - 1] if r.step else np.zeros(t.shape[1]))
                   if online else t)
    trusted = [e for r, e in zip(running, est) if not online or r.step >= cfg.warmup_steps]
    utilities = []
    for r, e in zip(running, est):
        if online and r.step < cfg.warmup_steps:
            # too little history: the mean of the trusted curves (cut to this row's grid), or none
            if trusted:
                n = e.size
                e = np.mean([np.resize(np.pad(x, (0, max(0, n - x.size)), mode="edge"), n)
                             for x in trusted], axis=0)
            else:
                e = np.zeros(e.size)
        utilities.append(e * rows[r.req.row].unique_per_step())
    caps = split.utility_split([mandatory] * len(running), utilities, slot_budget, cfg.granule)
    for r, c in zip(running, caps):
        r.capacity = int(c)
