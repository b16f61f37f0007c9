"""``avsg bench decode``: a modelled DeepSeek-V3.2 decode iteration on an Ascend 910B, per mode.

A projection, not a measurement: nothing here has run on an NPU.

**Modes** (each with its own copy traffic, its own matching cost and its own device memory):

``device``          all KV resident in HBM: no copies, no matching (the floor).
``offload``         no reuse: every iteration copies the union of its query tokens' selections
                    (the most copies of any mode; the weakest baseline).
``lru-host``        vllm-ascend's sparse KV offload: one exact LRU row of ``topk_buffer_size`` slots
                    (default 4096) per *query token*; per layer a D2H of the top-k, a host callback
                    running the LRU over the batch's rows (timed here: :mod:`.host_lru`, scaled by
                    the profile's ``host_cpu_time_factor``), an H2D of the copy descriptors and of
                    the slots, then the misses (two DMAs each: latent and RoPE part). Serial on the
                    layer's stream: nothing overlaps.
``lru-device``      a per-request exact LRU on the device with avsg's capacity, matched by the op's
                    own ``lru`` policy (its counted plan cost); copies overlap sparse attention (as
                    SGLang HiSparse overlaps them).
``slotmap-device``  SGLang's Ascend design: a direct-mapped position -> slot table of ``max_context``
                    int32 per request and layer; the lookup is one indexed read per selection, a
                    counted-work model (:func:`slotmap_counters`). On a miss with the buffer full it
                    evicts in FIFO order (oldest fill first), skipping slots this step hits: a
                    lookup-only kernel keeps no per-hit recency. Copies overlap attention.
``avsg``            the op's default policy (``reuse``), its counted plan cost; gather then
                    attention (``--overlap`` lets its copies overlap attention too).

**Inputs**, measured in the same run: the rows each mode copies per layer and iteration, replayed
over *every* layer of the trace (MTP-n: 1 + n query tokens, simulated acceptance, rejected drafts
invalidated), with the per-layer spread; the plan cost per policy and query-token count, read from
the CPU emulation's counted work of the real kernel (:func:`counted_plan`), and the slot map's from
its counted-work model, both turned into time by the profile (serial-pipe estimate); the host LRU's
time per row, measured here. The KV format follows the profile: BF16 rows (1152 B) unless the
profile's hardware has FP8 (656 B).

**Memory**: every row checks one card's HBM (weights + KV buffers + indexer keys + activations);
a configuration that does not fit is reported infeasible and never projected.

**Sensitivity**: every row also under a pessimistic and an optimistic profile (scalar,
vector-issue and link/host-latency constants at 3x and 1/3x).

**Records** (``--out DIR``/decode.json, ``records``): one per mode, batch, context, MTP and profile,
with ``feasible``, ``tpot_ms`` and ``tokens_per_s`` (None when infeasible), ``h2d_bytes_per_token``,
``plan_us_per_layer`` (the mode's matching cost per layer: plan or the slot-map lookup for the
device modes, the D2H + host LRU + descriptor copies for ``lru-host``), ``copy_us_per_layer`` (its
exposed copy time), the rows it copies and its memory per card (GB).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..cli_util import UsageError, float_in, int_in, size_list
from . import hardware

_HERE = os.path.dirname(os.path.abspath(__file__))
V32_CONFIG = os.path.join(_HERE, "profiles", "deepseek_v32_config.json")
MAX_BATCH = 4096
MODES = ("device", "offload", "lru-host", "lru-device", "slotmap-device", "avsg")
PEERS = ("offload", "lru-host", "lru-device", "slotmap-device")
PROFILES = ("bundled", "pessimistic", "optimistic")
# the constants the sensitivity profiles scale (3x pessimistic, 1/3x optimistic)
SENSITIVE = ("scalar_ub_cycles", "scalar_gm_cycles", "vec_issue_cycles", "host_dma_latency_s",
             "copy_launch_latency_s", "host_callback_latency_s")
PLAN_POLICY = {"avsg": "reuse", "lru-device": "lru"}
# per slot, the op's state (two hash buckets + slot pos + slot life, int32) and the slot map's
# reverse table (slot -> pos, int32)
OP_STATE_BYTES_PER_SLOT = 16
SLOTMAP_STATE_BYTES_PER_SLOT = 4
DESCRIPTOR_BYTES = 20          # host address, device address (int64), size (int32)


@dataclasses.dataclass(frozen=True)
class KVFormat:
    name: str
    row_bytes: int             # one token's MLA KV in one layer
    latent_bytes: int          # the part copied by the first of vllm-ascend's two DMAs
    index_row_bytes: int       # one token's indexer key in one layer


def kv_format(hw: hardware.Profile) -> KVFormat:
    """BF16 KV (512 + 64 bf16 = 1152 B) unless the profile's hardware computes in FP8, then the
    656 B FP8 row (512 e4m3 + 4 fp32 scales + 64 bf16 RoPE). The indexer keys follow: 128 bf16,
    or 128 fp8 + one fp32 scale."""
    if hw["fp8_compute"]:
        return KVFormat("fp8", 656, 528, 132)
    return KVFormat("bf16", 1152, 1024, 256)


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

    def mean(self, mode: str) -> float:
        return float(np.mean(self.rows[mode])) if self.rows.get(mode) else 0.0

    def spread(self, mode: str) -> Dict[str, float]:
        r = np.asarray(self.rows[mode], float)
        return {"min": float(r.min()), "p50": float(np.median(r)), "max": float(r.max())}


def _slotmap_policy_class():
    from ..traces.policies import LRU

    class SlotMapFIFO(LRU):
        """The slot map's eviction: oldest fill first (no recency update on a hit)."""
        name = "slotmap-fifo"

        def _on_hits(self, s, inp, hit, slot_of):
            pass
    return SlotMapFIFO


def load_trace_cut(trace_path: str, layers: Optional[int], steps: int, min_steps: int = 0):
    """The first ``layers`` x ``steps`` of a trace, their values checked (one-line errors)."""
    from ..cli_util import read_trace
    from ..traces.format import TraceFormatError, validate_trace
    trace = read_trace("--trace", trace_path, check_values=False)
    if trace.has_mtp_axis:
        raise UsageError(f"--trace: {trace_path} has an MTP axis; expected sel [layers, steps, k]")
    if trace.steps < min_steps:
        raise UsageError(f"--trace: {trace_path} has {trace.steps} steps; the counted plan needs "
                         f"at least {min_steps} (warm-up and measured launches)")
    trace = trace.subset(layers=slice(0, layers), steps=slice(0, steps))
    try:
        validate_trace(trace)
    except TraceFormatError as e:
        raise UsageError(f"--trace: {trace_path}: {e}") from None
    return trace



def measure_traffic(trace_path: str, drafts: int, accept_mean: float, capacity: int,
                    topk_buffer: int, steps: int, layers: Optional[int] = None) -> Traffic:
    """One MTP replay of the trace's first ``steps`` steps over all its layers (or ``layers``),
    every mode on the same schedule of accepted drafts; the first iteration warms the buffers and
    is not counted."""
    from ..traces import format as trace_format
    from ..traces.mtp import draw_accepted
    from ..traces.policies import StepInput, make_policy, unique_rows
    from .. import backend
    from ..demo import trace_label
    trace = trace_format.load_trace(trace_path, check_values=False)
    sel = trace.sel[:layers, :steps] if layers else trace.sel[:, :steps]
    L, N, K = sel.shape
    Tq = 1 + drafts
    pos = np.asarray(trace.positions[:steps]).astype(np.int64)
    if N < Tq + 1:
        raise ValueError(f"trace: expected at least {Tq + 1} steps, got {N}")
    max_pos = int(trace.T) + 8
    pols = {"avsg": make_policy("avsg", L, capacity, K, Tq, max_pos=max_pos),
            "lru-device": make_policy("lru", L, capacity, K, Tq, max_pos=max_pos),
            "slotmap-device": _slotmap_policy_class()(L, capacity, K, Tq, max_pos),
            "lru-host": make_policy("lru", L * Tq, topk_buffer, K, 1, max_pos=max_pos)}
    rows = {m: np.zeros(L) for m in ("offload", *pols)}
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
            if i > 0:
                for m in rows:
                    rows[m] += got[m]
                counted += 1
                emitted += 1 + a
            s += 1 + a
            i += 1
    if not counted:
        raise ValueError(f"trace: {N} steps give no counted iteration at MTP-{drafts}")
    return Traffic(drafts, accept_mean, emitted / counted, capacity, topk_buffer,
                   {m: (v / counted).tolist() for m, v in rows.items()},
                   f"{trace_label(trace_path)}: all {L} layers x {counted} iterations")


# ---------------------------------------------------------------- counted matching costs

def _read_counters():
    """The last emulated launch's counted work (the one place the model reads the kernel)."""
    from .. import backend
    return backend.last_launch_counters()


COUNTED_WARMUP, COUNTED_LAUNCHES = 48, 3     # plan launches before and under the counters


def counted_plan(trace_path: str, policy: str, queries: int, capacity: int,
                 warmup: int = COUNTED_WARMUP, measured: int = COUNTED_LAUNCHES,
                 rows: int = 2) -> List:
    """Counters of ``measured`` plan launches of the real kernel on the trace's first ``rows``
    layers (see :func:`counted_plan_on`)."""
    from ..demo import load_selections
    sel, positions, context = load_selections(trace_path, rows, warmup + (measured + 1) * queries)
    return counted_plan_on(sel, positions, int(context), policy, queries, capacity, warmup,
                           measured)


def counted_plan_on(sel: np.ndarray, positions: np.ndarray, context: int, policy: str,
                    queries: int, capacity: int, warmup: int = 48, measured: int = 3) -> List:
    """Counters of ``measured`` plan launches of the real kernel (strict emulation, one row per
    emulated core: ``sel`` int [rows, steps, K]), ``queries`` query tokens per row from
    consecutive steps, after ``warmup`` uncounted steps (fast emulation) so the buffers are warm;
    rejected drafts are never modelled here (every query token's KV stays valid)."""
    import torch
    from .. import backend
    from ..buffer import SparseKVBuffer
    rows, steps, K = sel.shape
    if steps < warmup + measured * queries:
        raise ValueError(f"trace: expected at least {warmup + measured * queries} steps for the "
                         f"counted plan, got {steps}")
    extra = {"max_context": int(context) + 8} if policy == "reuse" else {}
    buf = SparseKVBuffer(rows=rows, capacity=capacity, topk=K, queries_per_step=queries,
                         check=False, policy=policy, **extra)

    def launch(s):
        topk = torch.from_numpy(np.ascontiguousarray(sel[:, s:s + queries])).to(torch.int32)
        seq = torch.full((rows,), int(positions[s + queries - 1]) + 1, dtype=torch.int32)
        buf.plan(topk, seq)
    saved = backend.emulated_cores()
    backend.set_emulated_cores(rows)
    try:
        with backend.emulation("fast"):
            for s in range(0, warmup - queries + 1, queries):
                launch(s)
        out = []
        with backend.emulation("strict"):
            for j in range(measured):
                launch(warmup + j * queries)
                out.append(_read_counters())
    finally:
        backend.set_emulated_cores(saved)
    return out


def counted_us(counters: Sequence, hw: hardware.Profile) -> float:
    """Median serial-pipe estimate (us per row: the launch's slowest block) of counted launches."""
    return float(np.median([hardware.launch_estimate(c, hw)["serial_pipe_us"] for c in counters]))


def slotmap_counters(selections: int, misses: float):
    """Counted-work model of one row's slot-map lookup (one AIV block): the selections DMA'd in,
    one scalar read of ``slot_map[pos]`` per selection (an indexed read through the DCache: the
    cheapest form, a 4-byte DMA per selection costs ~4x more), four vector passes to mark hits
    and compact the misses, per miss one read of the FIFO victim's position, three scalar writes
    (clear the victim's entry, set the new one, the slot's position) and two cache-line flushes,
    and the slots DMA'd out. Shaped like the emulation's counters, so the profile prices it the
    way it prices the real kernels."""
    import torch
    n, m = float(selections), float(misses)
    chunks = math.ceil(4 * n / 16384)
    repeats = math.ceil(4 * n / 256)
    work = {"scalar_ub_reads": 0.0, "scalar_ub_writes": n, "scalar_gm_reads": n + m,
            "scalar_gm_writes": 3 * m, "vec_instrs": 4.0 * chunks, "vec_repeats": 4.0 * repeats,
            "mte2_copies": chunks, "mte2_bytes": 4 * n, "mte3_copies": chunks, "mte3_bytes": 4 * n,
            "pipe_barriers": 4.0, "set_flags": 2.0 * chunks, "wait_flags": 2.0 * chunks,
            "queue_syncs": 0.0, "sync_alls": 0.0, "dcci": 2 * m}

    class _Counters(dict):
        def __getitem__(self, k):
            return torch.tensor([dict.__getitem__(self, k)], dtype=torch.float64)
    return _Counters(work)


@dataclasses.dataclass
class Costs:
    """Matching costs per mode and query-token count: us per row (one row per AIV core), and the
    host LRU's us per query-token row measured on this machine."""
    plan_us: Dict[str, Dict[int, float]]        # mode -> T -> us per row
    host_us_per_row: float
    host_source: str


def measure_costs(trace_path: str, Ts: Sequence[int], capacity: int, topk_buffer: int,
                  traffic: Dict[int, Traffic], hw: hardware.Profile,
                  counters: Optional[Dict] = None) -> Costs:
    """Costs under ``hw``; ``counters`` (from :func:`plan_counters`) are profile-independent."""
    counters = counters or plan_counters(trace_path, Ts, capacity)
    plan_us: Dict[str, Dict[int, float]] = {m: {} for m in ("avsg", "lru-device", "slotmap-device")}
    for T in Ts:
        for mode, policy in PLAN_POLICY.items():
            plan_us[mode][T] = counted_us(counters[(policy, T)], hw)
        K = counters["k"]
        plan_us["slotmap-device"][T] = hardware.launch_estimate(
            slotmap_counters(T * K, traffic[T - 1].mean("slotmap-device")), hw)["serial_pipe_us"]
    host = counters["host"]
    return Costs(plan_us, host["us_per_row"] * hw["host_cpu_time_factor"],
                 f"host LRU timed on this machine: {host['us_per_row']:.1f} us per query-token "
                 f"row (median of {host['calls']} calls x {host['rows']} rows, {host['capacity']} "
                 f"slots, K {host['k']}), x {hw['host_cpu_time_factor']:g} (host_cpu_time_factor)")


def plan_counters(trace_path: str, Ts: Sequence[int], capacity: int,
                  topk_buffer: int = 4096) -> Dict:
    from ..demo import load_selections
    from . import host_lru
    out: Dict = {}
    for T in Ts:
        for policy in set(PLAN_POLICY.values()):
            out[(policy, T)] = counted_plan(trace_path, policy, T, capacity)
    from ..traces import format as trace_format
    layers = trace_format.load_trace(trace_path, check_values=False).layers
    sel, positions, context = load_selections(trace_path, layers, 48)
    out["k"] = int(sel.shape[2])
    out["host"] = host_lru.time_per_row_us(sel, positions, topk_buffer, int(context) + 8)
    return out


# ---------------------------------------------------------------- memory per card

def _attention_params(c) -> int:
    H, heads = c.hidden_size, c.num_attention_heads
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    return (H * c.q_lora_rank + c.q_lora_rank * heads * qk
            + H * (c.kv_lora_rank + c.qk_rope_head_dim)
            + c.kv_lora_rank * heads * (c.qk_nope_head_dim + c.v_head_dim)
            + heads * c.v_head_dim * H
            + c.q_lora_rank * c.index_n_heads * c.index_head_dim + H * c.index_head_dim
            + H * c.index_n_heads)


def _weights_bytes(c, tokens: int, cards: int, bytes_per_param: float = 1.0) -> Dict[str, float]:
    """Weight bytes one card *reads* per decode step, serving ``tokens`` query tokens, with
    attention data-parallel (weights replicated) and routed experts spread over ``cards``
    (expert parallelism, the way DeepSeek-V3.2 is served): a card reads its share of the experts
    that all cards' tokens touch."""
    H = c.hidden_size
    dense = 3 * H * c.intermediate_size
    expert = 3 * H * c.moe_intermediate_size
    global_tokens = tokens * cards
    touched = c.n_routed_experts * (1 - (1 - c.num_experts_per_tok / c.n_routed_experts)
                                    ** global_tokens) / cards
    moe_layers = c.num_hidden_layers - c.first_k_dense_replace
    b = bytes_per_param
    return {"attention": b * _attention_params(c) * c.num_hidden_layers,
            "dense_ffn": b * dense * c.first_k_dense_replace,
            "moe": b * moe_layers * (touched + c.n_shared_experts) * expert,
            "lm_head": b * H * c.vocab_size}


def weights_per_card(c, cards: int, bytes_per_param: float) -> float:
    """Weight bytes one card *holds*: attention, dense layers, shared experts, embedding, LM head
    and the MTP layer replicated; the routed experts split over ``cards``."""
    H = c.hidden_size
    expert = 3 * H * c.moe_intermediate_size
    layers = c.num_hidden_layers + c.num_nextn_predict_layers
    moe_layers = layers - c.first_k_dense_replace
    replicated = (_attention_params(c) * layers + 3 * H * c.intermediate_size
                  * c.first_k_dense_replace + moe_layers * c.n_shared_experts * expert
                  + 2 * H * c.vocab_size + c.num_nextn_predict_layers * 2 * H * H
                  + moe_layers * H * c.n_routed_experts)
    return bytes_per_param * (replicated + moe_layers * c.n_routed_experts * expert / cards)


def memory_per_card(c, hw: hardware.Profile, mode: str, batch: int, context: int, T: int,
                    capacity: int, topk_buffer: int, cards: int) -> Dict[str, float]:
    """Bytes on one card for ``batch`` requests of ``context`` tokens in ``mode``: weights, KV
    buffers (+ their matching state), indexer keys (always on the device), activations."""
    fmt = kv_format(hw)
    L = c.num_hidden_layers + c.num_nextn_predict_layers
    K = c.index_topk
    row = fmt.row_bytes
    per_request = {
        "device": L * context * row,
        # one layer's copy target at a time, double-buffered
        "offload": 2 * T * K * row,
        "lru-host": L * T * topk_buffer * row,
        "lru-device": L * capacity * (row + OP_STATE_BYTES_PER_SLOT),
        "slotmap-device": L * (capacity * (row + SLOTMAP_STATE_BYTES_PER_SLOT) + 4 * context),
        "avsg": L * (capacity * (row + OP_STATE_BYTES_PER_SLOT) + 4 * context),
    }[mode]
    tokens = batch * T
    activations = hw["activation_reserve_bytes"] + tokens * (
        4 * context                       # the indexer's fp32 scores of one layer
        + 2 * c.hidden_size * hw["activation_hidden_copies"])
    out = {"weights": weights_per_card(c, cards, hw["weight_bytes_per_param"]),
           "kv_buffers": batch * per_request,
           "indexer_keys": batch * L * context * fmt.index_row_bytes,
           "activations": activations}
    out["total"] = sum(out.values())
    out["hbm"] = hw["hbm_bytes"]
    out["feasible"] = out["total"] <= out["hbm"]
    return out


def max_batch(c, hw, mode, context, T, capacity, topk_buffer, cards, limit: int = 4096) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if memory_per_card(c, hw, mode, mid, context, T, capacity, topk_buffer, cards)["feasible"]:
            lo = mid
        else:
            hi = mid - 1
    return lo


# ---------------------------------------------------------------- one iteration's time

def _compute_layer_s(c, hw, fmt: KVFormat, batch: int, tokens: int, context: int,
                     cards: int) -> float:
    """(compute, sparse MLA) seconds of one layer for ``tokens`` query tokens of ``batch``
    requests: its share of the weights, the indexer over every cached key, sparse MLA over K
    rows per token (the part copies may overlap)."""
    L, K = c.num_hidden_layers, c.index_topk
    bits = 8 if fmt.name == "fp8" else 16
    weights = sum(_weights_bytes(c, tokens, cards, hw["weight_bytes_per_param"]).values()) / L
    index_s = max(hardware.hbm_time_s(hw, batch * context * fmt.index_row_bytes),
                  hardware.cube_time_s(hw, 2 * tokens * context * c.index_n_heads
                                       * c.index_head_dim, bits))
    mla_s = max(hardware.hbm_time_s(hw, tokens * K * fmt.row_bytes),
                hardware.cube_time_s(hw, 2 * tokens * K * c.num_attention_heads
                                     * (2 * c.kv_lora_rank + c.qk_rope_head_dim), 16))
    return hardware.hbm_time_s(hw, weights) + index_s + mla_s, mla_s


def _link_s(hw, rows: float, row_bytes: int, dmas_per_row: int = 1) -> float:
    """H2D of ``rows`` rows: bandwidth- or per-DMA-latency-bound, whichever is slower."""
    bandwidth = rows * row_bytes / hw["link_bytes_per_s"]
    latency = rows * dmas_per_row * hw["host_dma_latency_s"] / (
        hw["aiv_cores"] * hw["dma_in_flight_per_core"])
    return max(bandwidth, latency)


def layer_overhead_s(mode: str, hw, fmt: KVFormat, costs: Costs, rows: float, batch: int, T: int,
                     K: int, mla_s: float, overlap_avsg: bool) -> Dict[str, float]:
    """One layer's matching and copy time (s) in ``mode`` for ``rows`` copied rows per request."""
    if mode == "device":
        return {"match_s": 0.0, "copy_s": 0.0}
    waves = math.ceil(batch / hw["aiv_cores"])
    link = _link_s(hw, rows * batch, fmt.row_bytes)
    if mode == "offload":
        return {"match_s": 0.0, "copy_s": link}
    if mode == "lru-host":
        token_rows = batch * T
        small = 3 * hw["copy_launch_latency_s"]                   # D2H top-k, H2D descriptors, slots
        d2h = token_rows * K * 4 / hw["link_bytes_per_s"]
        h2d = (rows * batch * 2 * DESCRIPTOR_BYTES + token_rows * K * 4) / hw["link_bytes_per_s"]
        host = (hw["host_callback_latency_s"] + math.ceil(token_rows / hw["host_lru_threads"])
                * costs.host_us_per_row * 1e-6)
        return {"match_s": small + d2h + h2d + host,
                "copy_s": _link_s(hw, rows * batch, fmt.row_bytes, dmas_per_row=2)}
    match = waves * costs.plan_us[mode][T] * 1e-6
    overlaps = mode in ("lru-device", "slotmap-device") or overlap_avsg
    exposed = max(0.0, link - mla_s) if overlaps else link
    return {"match_s": match, "copy_s": exposed}


def project(c, hw: hardware.Profile, traffic: Traffic, costs: Optional[Costs], batch: int,
            context: int, cards: int, overlap_avsg: bool = False,
            modes: Sequence[str] = MODES) -> Dict[str, Dict]:
    """One modelled decode iteration per mode for ``batch`` requests per card: the main model's
    layers on 1 + n query tokens (per-layer traffic: the mean layer time over the trace's layers),
    then n draft passes of the MTP layer on one token each. Infeasible modes get no times."""
    fmt = kv_format(hw)
    T = 1 + traffic.drafts
    L, K = c.num_hidden_layers, c.index_topk
    compute_s, mla_s = _compute_layer_s(c, hw, fmt, batch, batch * T, context, cards)
    draft_s, draft_mla_s = _compute_layer_s(c, hw, fmt, batch, batch, context, cards)
    out = {}
    for mode in modes:
        if mode not in traffic.rows and mode not in ("device",):
            continue
        mem = memory_per_card(c, hw, mode, batch, context, T, traffic.capacity,
                              traffic.topk_buffer, cards)
        rec = {"feasible": bool(mem["feasible"]), "memory": mem,
               "h2d_bytes_per_token": (L * traffic.mean(mode) * fmt.row_bytes
                                       / traffic.tokens_per_iteration) if mode != "device" else 0.0}
        if costs is None and mode not in ("device", "offload"):
            continue
        per_layer = []
        for rows in (traffic.rows[mode] if mode != "device" else [0.0]):
            o = layer_overhead_s(mode, hw, fmt, costs, rows, batch, T, K, mla_s, overlap_avsg)
            per_layer.append((o["match_s"], o["copy_s"]))
        match_s = float(np.mean([m for m, _ in per_layer]))
        copy_s = float(np.mean([cp for _, cp in per_layer]))
        # a draft pass: one token per request through the MTP layer, its share of the copies
        draft = traffic.drafts * (draft_s + (match_s + copy_s) / T)
        step = L * (compute_s + match_s + copy_s) + draft
        rec.update(step_s=step, compute_s=L * compute_s, match_s=L * match_s, copy_s=L * copy_s,
                   draft_s=draft,
                   plan_us_per_layer=1e6 * match_s,
                   rows_per_layer=traffic.mean(mode) if mode != "device" else 0.0)
        if rec["feasible"]:
            rec["tpot_s"] = step / traffic.tokens_per_iteration
            rec["tokens_per_s"] = batch * traffic.tokens_per_iteration / step
        else:
            rec["tpot_s"] = rec["tokens_per_s"] = None
        out[mode] = rec
    return out


def profile_variant(hw: hardware.Profile, name: str) -> hardware.Profile:
    """``bundled`` as loaded; ``pessimistic``/``optimistic``: the SENSITIVE constants x3 / x1/3."""
    if name == "bundled":
        return hw
    factor = {"pessimistic": 3.0, "optimistic": 1 / 3}[name]
    entries = json.loads(json.dumps(hw.entries))
    p = hardware.Profile(entries, hw.path)
    for key in SENSITIVE:
        p.override(key, hw[key] * factor, f"{name}: {hw.entries[key]['source']} x {factor:.3g}")
    p.name = f"{hw.name} ({name})"
    return p


def best_peer(p: Dict[str, Dict]) -> Optional[str]:
    feasible = [m for m in PEERS if m in p and p[m]["feasible"] and p[m].get("tpot_s")]
    return min(feasible, key=lambda m: p[m]["tpot_s"]) if feasible else None


# ---------------------------------------------------------------- the command

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hw", default=hardware.DEFAULT_PROFILE,
                        help="hardware profile JSON (default: the bundled 910B assumptions)")
    parser.add_argument("--config", default=V32_CONFIG,
                        help="DeepSeek-V3.2 config.json (default: the released one's keys)")
    parser.add_argument("--trace", help="selection trace for the copies (default: the "
                        "embedded asyncio_32k_8x256)")
    parser.add_argument("--trace-layers", type=int_in(0, 4096), default=0,
                        help="trace layers replayed, 0..4096 (default 0: all of them)")
    parser.add_argument("--trace-steps", type=int_in(8, 1 << 20), default=256,
                        help="trace steps replayed, 8..1048576 (default 256)")
    parser.add_argument("--capacity", type=int_in(1, 32768), default=8192,
                        help="slots per request and layer of avsg, lru-device and slotmap-device, "
                             "(1 + 3) x top-k..32768 (default 8192)")
    parser.add_argument("--topk-buffer-size", type=int_in(1, 1 << 20), default=4096,
                        help="lru-host slots per query token and layer (vllm-ascend's "
                             "topk_buffer_size), top-k..1048576 (default 4096)")
    parser.add_argument("--batch", default="1,8,32,64",
                        help=f"batch sizes per card, 1..{MAX_BATCH} (default 1,8,32,64)")
    parser.add_argument("--context", default="32K,128K",
                        help="context lengths, from the model's top-k to its positions (163840 "
                             "for DeepSeek-V3.2); 32K = 32768 (default 32K,128K)")
    parser.add_argument("--mtp", default="0,1,2,3", help="MTP draft counts, 0..3 (default 0,1,2,3)")
    parser.add_argument("--accept-mean", type=float_in(0, 3), default=2.0,
                        help="mean accepted drafts per iteration at MTP-3, 0..3 (scaled for other "
                             "n; default 2.0)")
    parser.add_argument("--link-gbps", type=float_in(0, 1e4, low_open=True),
                        help="override the host link, GB/s, in (0, 1e4]")
    parser.add_argument("--cards", type=int_in(1, 4096), default=32,
                        help="cards serving the model, 1..4096: attention data-parallel, experts "
                             "spread over the cards (default 32)")
    parser.add_argument("--overlap", action="store_true",
                        help="let avsg's copies overlap attention too (the device peers' do)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="directory for decode.json and the TPOT plot (default "
                             "avsg-results/bench-decode/)")
    parser.add_argument("--json", metavar="PATH", help="JSON path (default OUT/decode.json)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress output (the command shows none; accepted as by every "
                             "bench)")
    parser.add_argument("--tables", metavar="PATH",
                        help="also write the summary tables as Markdown to PATH "
                             "(docs/results/decode.md, regenerated this way, is what README.md "
                             "and docs/benchmarks.md quote)")


def load_inputs(args):
    from ..runtime.config import from_hf_config
    try:
        hw = hardware.load_profile(args.hw)
        config = from_hf_config(args.config)
        for key in ("fp8_compute", "hbm_bytes", "weight_bytes_per_param", "host_cpu_time_factor",
                    "host_lru_threads", "host_callback_latency_s", "copy_launch_latency_s",
                    "activation_reserve_bytes", "activation_hidden_copies", *SENSITIVE):
            hw[key]
    except (ValueError, KeyError) as e:
        raise UsageError(str(e).strip("'\"")) from None
    return hw, config


def main(args: argparse.Namespace) -> int:
    from . import common
    out = common.out_dir(args, "decode")        # where the results go, before any work
    batches = size_list("--batch", args.batch, 1, MAX_BATCH)
    mtps = sorted(set(size_list("--mtp", args.mtp, 0, 3)))
    hw, config = load_inputs(args)
    contexts = size_list("--context", args.context, config.index_topk,
                         config.max_position_embeddings)
    if args.link_gbps is not None:
        hw.override("link_bytes_per_s", args.link_gbps * 1e9, "--link-gbps")
    trace = common.trace_path(args.trace)
    if args.capacity < 4 * config.index_topk:
        raise UsageError(f"--capacity: expected >= (1 + 3) x top-k = {4 * config.index_topk}, "
                         f"got {args.capacity}")
    if args.topk_buffer_size < config.index_topk:
        raise UsageError(f"--topk-buffer-size: expected >= top-k = {config.index_topk}, got "
                         f"{args.topk_buffer_size}")
    cut = load_trace_cut(trace, args.trace_layers or None, args.trace_steps,
                         min_steps=COUNTED_WARMUP + (COUNTED_LAUNCHES + 1) * (1 + max(mtps)))
    if cut.k != config.index_topk:
        raise UsageError(f"--trace: it selects top-{cut.k}, the model's index_topk is "
                         f"{config.index_topk}")
    t0 = time.perf_counter()
    fmt = kv_format(hw)
    print(f"avsg bench decode: DeepSeek-V3.2 ({config.num_hidden_layers} layers, top-"
          f"{config.index_topk}), {fmt.name.upper()} KV ({fmt.row_bytes} B/token/layer), "
          f"hardware '{hw.name}', {args.cards} cards (experts spread over them), batch per card")
    print(f"  MODEL ESTIMATE, not a measurement: {hw.status}")
    traffic: Dict[int, Traffic] = {}
    for n in mtps:
        accept = args.accept_mean * n / 3 if n else 0.0
        try:
            traffic[n] = measure_traffic(trace, n, accept, args.capacity, args.topk_buffer_size,
                                         args.trace_steps, args.trace_layers or None)
        except ValueError as e:
            raise UsageError(f"--trace: {e}") from None
    print(f"  copies measured on {traffic[mtps[0]].source} (MTP-n: 1+n query tokens, simulated "
          f"acceptance); rows per request, layer and iteration, mean [min-max over layers]:")
    for n in mtps:
        tr = traffic[n]
        print(f"    MTP-{n} ({tr.tokens_per_iteration:.2f} tokens/iteration): " + ", ".join(
            f"{m} {tr.mean(m):,.0f} [{tr.spread(m)['min']:,.0f}-{tr.spread(m)['max']:,.0f}]"
            for m in ("offload", "lru-host", "lru-device", "slotmap-device", "avsg")))
    counters = plan_counters(trace, [1 + n for n in mtps], args.capacity, args.topk_buffer_size)
    # traffic keyed by T - 1 = drafts for the slot map's miss count
    costs = {name: measure_costs(trace, [1 + n for n in mtps], args.capacity,
                                 args.topk_buffer_size, traffic, profile_variant(hw, name), counters)
             for name in PROFILES}
    b = costs["bundled"]
    print("  matching per row and layer, us (counted work, serial-pipe, bundled profile): " +
          "; ".join(f"T={1 + n}: avsg {b.plan_us['avsg'][1 + n]:.0f}, lru-device "
                    f"{b.plan_us['lru-device'][1 + n]:.0f}, slotmap {b.plan_us['slotmap-device'][1 + n]:.0f}"
                    for n in mtps))
    print(f"  {b.host_source}")
    records, rows = [], []
    for n in mtps:
        for context in contexts:
            for batch in batches:
                point = {}
                for name in PROFILES:
                    hwp = profile_variant(hw, name)
                    p = project(config, hwp, traffic[n], costs[name], batch, context, args.cards,
                                args.overlap)
                    point[name] = p
                    for mode, r in p.items():
                        records.append({"mode": mode, "batch": batch, "context": context,
                                        "mtp": n, "profile": name, "feasible": r["feasible"],
                                        "tpot_ms": 1e3 * r["tpot_s"] if r["tpot_s"] else None,
                                        "tokens_per_s": r["tokens_per_s"],
                                        "h2d_bytes_per_token": r["h2d_bytes_per_token"],
                                        "plan_us_per_layer": r["plan_us_per_layer"],
                                        "copy_us_per_layer": 1e6 * r["copy_s"] / config.num_hidden_layers,
                                        "rows_per_layer": r["rows_per_layer"],
                                        "memory_gb": {k: v / 1e9 for k, v in r["memory"].items()
                                                      if k != "feasible"}})
                rows.append(summarize(point, n, batch, context))
    limits = {(m, ctx, n): max_batch(config, hw, m, ctx, 1 + n, args.capacity,
                                     args.topk_buffer_size, args.cards)
              for m in MODES for ctx in contexts for n in mtps}
    at_memory = []
    for n in mtps:
        for context in contexts:
            entry = {"mtp": n, "context": context}
            for name in PROFILES:
                hwp = profile_variant(hw, name)
                per_mode = {}
                for m in MODES:
                    b = limits[(m, context, n)]
                    if b < 1:
                        per_mode[m] = {"batch": 0, "tokens_per_s": None}
                        continue
                    r = project(config, hwp, traffic[n], costs[name], b, context, args.cards,
                                args.overlap, modes=(m,))[m]
                    per_mode[m] = {"batch": b, "tokens_per_s": r["tokens_per_s"],
                                   "tpot_ms": 1e3 * r["tpot_s"]}
                peers = [m for m in PEERS if per_mode[m]["tokens_per_s"]]
                best = max(peers, key=lambda m: per_mode[m]["tokens_per_s"]) if peers else None
                entry[name] = {"modes": per_mode, "best_peer": best,
                               "throughput_ratio": (per_mode["avsg"]["tokens_per_s"]
                                                    / per_mode[best]["tokens_per_s"])
                               if best and per_mode["avsg"]["tokens_per_s"] else None}
            at_memory.append(entry)
    _print_summary(rows, limits, mtps, contexts, hw, config, args.cards)
    _print_at_memory(at_memory)
    json_path = args.json or os.path.join(out, "decode.json")
    os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
    with open(json_path, "w") as f:
        json.dump({"hardware": hw.sources(), "hardware_name": hw.name, "estimate": True,
                   "kv_format": dataclasses.asdict(fmt), "cards": args.cards,
                   "overlap_avsg": args.overlap, "sensitive_constants": list(SENSITIVE),
                   "traffic": {n: dataclasses.asdict(t) for n, t in traffic.items()},
                   "matching_us_per_row": {name: c.plan_us for name, c in costs.items()},
                   "host_lru": counters["host"], "max_batch": [
                       {"mode": m, "context": ctx, "mtp": n, "max_batch": v}
                       for (m, ctx, n), v in limits.items()],
                   "summary": rows, "at_memory": at_memory, "records": records}, f, indent=1,
                  default=str)
    plot_path = common.save_plot(os.path.join(out, "decode_tpot.png"),
                                 lambda p: _plot(records, p))
    print(f"  JSON: {json_path}\n  plot: {plot_path}\n  ({time.perf_counter() - t0:.0f} s)")
    if args.tables:
        common.write_tables(args.tables, common.invocation(args),
                            _tables(rows, limits, mtps, contexts, hw, args.cards, at_memory),
                            note="A model of a 910B with assumed constants, not a measurement.")
        print(f"  tables: {args.tables}")
    return 0


def summarize(point: Dict[str, Dict[str, Dict]], mtp: int, batch: int, context: int) -> Dict:
    """avsg against the best feasible peer under each profile."""
    out = {"mtp": mtp, "batch": batch, "context": context}
    for name, p in point.items():
        a = p["avsg"]
        peer = best_peer(p)
        d = {"avsg_feasible": a["feasible"], "avsg_tpot_ms": 1e3 * a["tpot_s"] if a["tpot_s"] else None,
             "best_peer": peer, "device_feasible": p["device"]["feasible"],
             "device_tpot_ms": 1e3 * p["device"]["tpot_s"] if p["device"]["tpot_s"] else None,
             "avsg_gb": a["memory"]["total"] / 1e9}
        if peer:
            d["peer_tpot_ms"] = 1e3 * p[peer]["tpot_s"]
        if peer and a["feasible"]:
            d["tpot_ratio"] = a["tpot_s"] / p[peer]["tpot_s"]
            d["throughput_ratio"] = a["tokens_per_s"] / p[peer]["tokens_per_s"]
        out[name] = d
    return out


def _verdict(row: Dict) -> str:
    ratios = [row[p].get("tpot_ratio") for p in PROFILES]
    if any(r is None for r in ratios):
        return "-"
    if all(r < 0.97 for r in ratios):
        return "avsg faster (all three)"
    if all(r > 1.03 for r in ratios):
        return "avsg slower (all three)"
    if all(0.97 <= r <= 1.03 for r in ratios):
        return "within 3% (all three)"
    return "depends on the profile"


def _cell(row: Dict) -> List[str]:
    b = row["bundled"]
    if not b["avsg_feasible"]:
        return ["infeasible", f"{b['avsg_gb']:.0f} GB > HBM", "-", "-", "-", "-", "-"]
    if not b["best_peer"]:
        return [f"{b['avsg_tpot_ms']:.1f} ms", "no peer fits", "-", "-", "-", "-", "-"]
    return [f"{b['avsg_tpot_ms']:.1f} ms", f"{b['best_peer']} {b['peer_tpot_ms']:.1f} ms",
            f"{b['tpot_ratio']:.2f}", f"{row['pessimistic'].get('tpot_ratio', float('nan')):.2f}",
            f"{row['optimistic'].get('tpot_ratio', float('nan')):.2f}",
            f"{b['throughput_ratio']:.2f}x", _verdict(row)]


HEADER = ["MTP", "batch", "context", "avsg TPOT", "best peer TPOT", "avsg/peer TPOT",
          "pessimistic", "optimistic", "throughput", "conclusion", "device TPOT"]


def _print_summary(rows, limits, mtps, contexts, hw, config, cards) -> None:
    print("\n  avsg vs the best feasible peer (lowest TPOT of offload, lru-host, lru-device, "
          "slotmap-device); ratios under the bundled / pessimistic / optimistic profiles")
    print("  " + " | ".join(f"{h:>14}" if i > 2 else f"{h:>7}" for i, h in enumerate(HEADER)))
    for r in rows:
        dev = r["bundled"]
        cells = [str(r["mtp"]), str(r["batch"]), f"{r['context'] // 1024}K", *_cell(r),
                 f"{dev['device_tpot_ms']:.1f} ms" if dev["device_feasible"] else "infeasible"]
        print("  " + " | ".join(f"{c:>14}" if i > 2 else f"{c:>7}" for i, c in enumerate(cells)))
    print("\n  most requests per card that fit in HBM (weights + KV buffers + indexer keys + "
          "activations):")
    for ctx in contexts:
        for n in mtps:
            print(f"    {ctx // 1024}K, MTP-{n}: " + ", ".join(f"{m} {limits[(m, ctx, n)]}"
                                                          for m in MODES))
    print("\n  Left out of the model: kernel launch overheads of the device modes, MoE all-to-all "
          "across cards, dequantisation, queueing on a link shared between cards, and any NPU "
          "measurement: calibrate the profile on a card.")


def _at_memory_row(e: Dict) -> List[str]:
    b = e["bundled"]
    a = b["modes"]["avsg"]
    peer = b["best_peer"]
    ratios = [e[p]["throughput_ratio"] for p in PROFILES]
    if any(r is None for r in ratios):
        verdict = "-"
    elif all(r > 1.03 for r in ratios):
        verdict = "avsg higher (all three)"
    elif all(r < 0.97 for r in ratios):
        verdict = "avsg lower (all three)"
    else:
        verdict = "depends on the profile"
    fmt = lambda r: f"{r:.2f}x" if r is not None else "-"  # noqa: E731
    return [str(e["mtp"]), f"{e['context'] // 1024}K",
            f"{a['batch']}: {a['tokens_per_s']:,.0f} tok/s" if a["tokens_per_s"] else "none fits",
            f"{peer} {b['modes'][peer]['batch']}: {b['modes'][peer]['tokens_per_s']:,.0f} tok/s"
            if peer else "none fits", *[fmt(r) for r in ratios], verdict]


AT_MEMORY_HEADER = ["MTP", "context", "avsg at its largest batch", "best peer at its largest batch",
                    "throughput avsg/peer", "pessimistic", "optimistic", "conclusion"]


def _print_at_memory(at_memory: List[Dict]) -> None:
    print("\n  throughput per card with each mode at the largest batch its memory allows:")
    for e in at_memory:
        print("    " + " | ".join(_at_memory_row(e)))


def _tables(rows, limits, mtps, contexts, hw, cards, at_memory=()) -> List[str]:
    from . import common
    body = []
    for r in rows:
        dev = r["bundled"]
        body.append([str(r["mtp"]), str(r["batch"]), f"{r['context'] // 1024}K", *_cell(r),
                     f"{dev['device_tpot_ms']:.1f} ms" if dev["device_feasible"] else "infeasible"])
    head = [row for r, row in zip(rows, body) if r["mtp"] in (0, 3) and r["batch"] in (1, 8)]
    blocks = [common.markdown_table("decode", HEADER, body, "rrrrlrrrrlr")]
    if head:
        blocks.insert(0, common.markdown_table("decode-headline", HEADER, head, "rrrrlrrrrlr"))
    cap = [[f"{ctx // 1024}K", str(n), *[str(limits[(m, ctx, n)]) for m in MODES]]
           for ctx in contexts for n in mtps]
    blocks.append(common.markdown_table("decode-max-batch", ["context", "MTP", *MODES], cap))
    if at_memory:
        blocks.append(common.markdown_table("decode-at-memory", AT_MEMORY_HEADER,
                                            [_at_memory_row(e) for e in at_memory], "rrllrrrl"))
    return blocks


def _plot(records: List[Dict], path: str) -> None:
    from . import common
    plt = common.pyplot()
    recs = [r for r in records if r["profile"] == "bundled" and r["feasible"]]
    mtps = sorted({r["mtp"] for r in records})
    contexts = sorted({r["context"] for r in records})
    fig, axes = plt.subplots(len(contexts), len(mtps), figsize=(4.5 * len(mtps), 3.6 * len(contexts)),
                             squeeze=False)
    for ci, ctx in enumerate(contexts):
        for mi, n in enumerate(mtps):
            ax = axes[ci][mi]
            for mode in MODES:
                pts = sorted((r["batch"], r["tpot_ms"]) for r in recs
                             if r["mtp"] == n and r["context"] == ctx and r["mode"] == mode)
                if pts:
                    ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=mode)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{ctx // 1024}K, MTP-{n}", fontsize=9)
            ax.set_xlabel("batch per card")
            ax.set_ylabel("TPOT ms (model)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("avsg bench decode: DeepSeek-V3.2 on an assumed 910B profile (feasible rows only), "
                 "an estimate", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
