"""The decode model: one DeepSeek-V3.2 decode iteration on an Ascend 910B, per mode (``avsg bench
decode`` prints it; ``avsg run`` and ``avsg serve-sim`` use it).

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
``fused-2048``      vllm-ascend's fused path (``npu_fused_sparse_attention_overlap``, PR #14278) as
                    merged: one selection cache of K slots per query token holding its last top-k
                    (:mod:`.fused`: copies from an exact replay of its kernel; matching from a
                    counted-work model of its kernel source); its copies overlap its attention;
                    no launch beside attention.
``fused-4096``      the same path with ``topk_buffer_size`` slots per query token (default 4096,
                    ``--topk-buffer-size``): an exact LRU per token (``lru-host``'s copies), the
                    merged kernel's matching scaled to that many resident entries.
``avsg``            the op's default policy (``lifetime``), its counted plan cost; gather then
                    attention (``--overlap`` lets its copies overlap attention too).
``avsg-split``      avsg with the hit/miss split where the rule chooses it
                    (:mod:`avsg.cache.split_rule`, docs/overlap.md sections 4-5), per layer and
                    pass: attention over the hits while the gather copies the misses on ``C``
                    cores, then attention over the misses and the LSE merge; priced with the
                    overlap ``o = 1`` where the cores allow it (the profile's assumed
                    ``attention_aiv_cores`` ``A`` + ``C`` <= ``aiv_cores``; ``C`` defaults to the
                    cores left, ``aiv_cores - A``).
``avsg-split-o0``   the same rule without the overlap (``o = 0``, the gather on every core): the
                    rule then never splits, so its TPOT is avsg's; ``forced_tpot_s`` is the
                    split's price if it were switched on anyway.

**Launches**: every mode pays ``launches_per_layer(mode)`` kernel launches per layer and pass
beside attention, each at a cost per launch (``launch_s``; the profile's ``launch_graph_s`` by
default: decode runs graph-captured). avsg's count is the serving manager's
(:data:`..cache.manager.SERVING_LAUNCHES`, held equal to what it dispatches by a test); the
split adds :func:`..cache.manager.split_added_launches` on every layer where it is chosen: the
gather's own launch (the split's copy leaves the fused ``plan_gather`` for its own stream) and
:data:`..cache.split_rule.SPLIT_LAUNCHES` (the split_slots kernel that emits the hit/miss lists,
the second attention call and the merge), each held equal to what the serving step and the
plugin's split launch by a test. The torch glue around the
kernels is left out for every mode.

**Inputs**, measured in the same run: the rows each mode copies per layer and iteration, replayed
over *every* layer of the trace (MTP-n: 1 + n query tokens, simulated acceptance, rejected drafts
invalidated), with the per-layer spread; the plan cost per policy and query-token count, read from
the CPU emulation's counted work of the real kernels on the same MTP schedule (the plan, whose one
launch also drops what the last pass rejected: :func:`counted_plan`), and the slot map's from
its counted-work model (rejected positions included), both turned into time by the profile (serial-pipe estimate); the host LRU's
time per row, measured here. The KV format follows the profile: BF16 rows (1152 B) unless the
profile's hardware has FP8 (656 B).

**Memory**: every row checks one card's HBM (weights + KV buffers + indexer keys + activations);
a configuration that does not fit is reported infeasible and never projected.

**Sensitivity**: every row also under a pessimistic and an optimistic profile (scalar,
vector-issue and link/host-latency constants at 3x and 1/3x).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from . import fused, hardware
from .plan_cost import SPLIT_PRICED, Costs
from .traffic import Traffic

_HERE = os.path.dirname(os.path.abspath(__file__))
V32_CONFIG = os.path.join(_HERE, "profiles", "deepseek_v32_config.json")
MAX_BATCH = 4096
MODES = ("device", "offload", "lru-host", "lru-device", "slotmap-device", "fused-2048",
         "fused-4096", "avsg", "avsg-apart", "avsg-split", "avsg-split-o0")
# avsg with the hit/miss split: priced with the overlap where the cores allow it (o = 1), and
# without it (o = 0); both copy what avsg copies and hold what it holds
SPLIT_MODES = {"avsg-split": True, "avsg-split-o0": False}
# avsg as the serving core runs it on an NPU until `avsg doctor` has verified the cross-core
# wait there (AVSG_NPU_SPLIT=1, manager.default_fuse_copy): plan, then gather, two launches, no
# SyncAll, the copy after the plan. It copies what avsg copies and holds what it holds.
APART_MODE = "avsg-apart"


def priced_as(mode: str) -> str:
    """The mode whose traffic, plan cost and memory ``mode`` shares: avsg for its variants."""
    return "avsg" if mode in SPLIT_MODES or mode == APART_MODE else mode
PEERS = ("offload", "lru-host", "lru-device", "slotmap-device", "fused-2048", "fused-4096")
LAUNCH_SENSITIVITY_US = (0.0, 2.0, 5.0, 10.0)   # the launch costs every ratio is also given at
# Kernel launches per layer and pass beside attention, for the peers (avsg's and lru-device's
# come from the serving manager): what each integration is described to launch.
PEER_LAUNCHES = {
    "device": 0,
    "offload": 1,           # one copy of the union of the pass's selections
    "lru-host": 1,          # the batched miss copy; its D2H, H2D and host callback are priced
                            # by their own latencies (copy_launch_latency_s, host_callback_...)
    "slotmap-device": 2,    # SGLang Ascend: the slot-map lookup + evict, the gather into the
                            # per-step buffer
    "fused-2048": 0,        # matching and copies inside the attention kernel
    "fused-4096": 0,
}


def launches_per_layer(mode: str, split_chosen: bool = False) -> int:
    """Kernel launches ``mode`` adds per layer and pass beside attention. avsg and lru-device
    run through the serving manager: the kernels it launches (``SERVING_LAUNCHES``); the split
    modes add ``split_added_launches()`` where the rule chooses the split (``split_chosen``)."""
    if mode in SPLIT_MODES:
        from ...cache import manager
        return launches_per_layer("avsg") + (manager.split_added_launches() if split_chosen
                                             else 0)
    if mode in ("avsg", "lru-device"):
        from ...cache import manager
        return len(manager.SERVING_LAUNCHES)
    if mode == APART_MODE:
        from ...cache import manager
        return len(manager.SERVING_LAUNCHES_APART)
    return PEER_LAUNCHES[mode]


def fused_slots(mode: str, k: int, topk_buffer: int) -> int:
    """Slots per query token: the top-k for the merged kernel, ``topk_buffer_size`` (default
    4096, ``--topk-buffer-size``) for ``fused-4096``."""
    return k if mode == "fused-2048" else topk_buffer


def fused_workers(hw: hardware.Profile) -> int:
    """Vector cores that run the fused kernel's selection update: ``RunAllCoreSelectionUpdate``
    hands rows to ``GetBlockNum()`` workers (the cube-vector groups, half the vector cores); the
    vector cores numbered past it return."""
    return max(1, int(hw["aiv_cores"]) // 2)
PROFILES = ("bundled", "pessimistic", "optimistic")
# the constants the sensitivity profiles scale (3x pessimistic, 1/3x optimistic)
SENSITIVE = ("scalar_ub_cycles", "scalar_gm_cycles", "vec_issue_cycles", "host_dma_latency_s",
             "copy_launch_latency_s", "host_callback_latency_s")
# per slot, the op's state (the lifetime and lru layout at H = 2S: two int16 hash buckets, the
# slot's position (int32), its life (int16), its stash key and stash slot (int32);
# reference.Layout) and the slot map's reverse table (slot -> pos, int32)
OP_STATE_BYTES_PER_SLOT = 2 * 2 + 4 + 2 + 2 * 4
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


def weights_read_bytes(c, tokens: int, cards: int, bytes_per_param: float = 1.0) -> Dict[str, float]:
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
    # the split holds what avsg holds, plus one layer's hit and miss lists (int32 [T, K] each,
    # per request) among the activations
    split_lists = 2 * T * K * 4 if mode in SPLIT_MODES else 0
    mode = priced_as(mode)
    per_request = {
        "device": L * context * row,
        # one layer's copy target at a time, double-buffered
        "offload": 2 * T * K * row,
        "lru-host": L * T * topk_buffer * row,
        "lru-device": L * capacity * (row + OP_STATE_BYTES_PER_SLOT),
        "slotmap-device": L * (capacity * (row + SLOTMAP_STATE_BYTES_PER_SLOT) + 4 * context),
        "avsg": L * (capacity * (row + OP_STATE_BYTES_PER_SLOT) + 4 * context),
    } if not mode.startswith("fused") else {
        # per query token: its slots, the status row (a position per slot + a count) and the
        # INT16 membership map row (16,400 entries, kept at any context)
        mode: L * T * (fused_slots(mode, K, topk_buffer) * (row + 4) + 4
                       + 2 * fused.MEMBERSHIP_STRIDE_INT16)}
    per_request = per_request[mode]
    tokens = batch * T
    activations = hw["activation_reserve_bytes"] + batch * split_lists + tokens * (
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
                     cards: int) -> Tuple[float, float]:
    """(compute, sparse MLA) seconds of one layer for ``tokens`` query tokens of ``batch``
    requests: its share of the weights, the indexer over every cached key, sparse MLA over K
    rows per token (the part copies may overlap)."""
    L, K = c.num_hidden_layers, c.index_topk
    bits = 8 if fmt.name == "fp8" else 16
    weights = sum(weights_read_bytes(c, tokens, cards, hw["weight_bytes_per_param"]).values()) / L
    index_s = max(hardware.hbm_time_s(hw, batch * context * fmt.index_row_bytes),
                  hardware.cube_time_s(hw, 2 * tokens * context * c.index_n_heads
                                       * c.index_head_dim, bits))
    mla_s = mla_time_s(c, hw, fmt, tokens)
    return hardware.hbm_time_s(hw, weights) + index_s + mla_s, mla_s


def mla_time_s(c, hw, fmt: KVFormat, tokens: int) -> float:
    """Sparse MLA of one layer over K rows per query token: HBM- or cube-bound (linear in the
    selections, so the split's rule reads its per-selection rate from it)."""
    K = c.index_topk
    return max(hardware.hbm_time_s(hw, tokens * K * fmt.row_bytes),
               hardware.cube_time_s(hw, 2 * tokens * K * c.num_attention_heads
                                    * (2 * c.kv_lora_rank + c.qk_rope_head_dim), 16))


def _link_s(hw, rows: float, row_bytes: int, dmas_per_row: int = 1,
            cores: Optional[int] = None) -> float:
    """H2D of ``rows`` rows on ``cores`` cores (default all): bandwidth- or per-DMA-latency-bound,
    whichever is slower."""
    bandwidth = rows * row_bytes / hw["link_bytes_per_s"]
    latency = rows * dmas_per_row * hw["host_dma_latency_s"] / (
        (cores or hw["aiv_cores"]) * hw["dma_in_flight_per_core"])
    return max(bandwidth, latency)


def layer_overhead_s(mode: str, hw, fmt: KVFormat, costs: Costs, rows: float, batch: int, T: int,
                     K: int, mla_s: float, overlap_avsg: bool, traffic: Optional[Traffic] = None,
                     context: int = 0) -> Dict[str, float]:
    """One layer's matching and copy time (s) in ``mode`` for ``rows`` copied rows per request."""
    if mode == "device":
        return {"match_s": 0.0, "copy_s": 0.0}
    if mode.startswith("fused"):
        # per query-token row: the selection update (the matching, before the kernel's SyncAll;
        # rows spread over the workers) and the rows MergeKv copies while attention runs: the
        # copy overlaps attention (max, not sum); the synchronous copies are in the matching
        summary = traffic.fused[mode]
        work = fused.matching_us(summary, hw, context, K,
                                 fused_slots(mode, K, traffic.topk_buffer), fmt.row_bytes,
                                 fmt.latent_bytes)
        per_row = sum(summary[g]["share"] * summary[g]["misses"] for g in fused.REGIMES)
        deferred = rows * (work["deferred_rows"] / per_row if per_row else 0.0)
        waves = math.ceil(batch * T / fused_workers(hw))
        link = _link_s(hw, deferred * batch, fmt.row_bytes, dmas_per_row=2)
        return {"match_s": waves * work["us_per_row"] * 1e-6, "copy_s": max(0.0, link - mla_s)}
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
    if mode in SPLIT_PRICED:
        # the op's plan (avsg: plan_gather's), its lookup split over the cores the rows leave
        # (buffer.lookup_split: on wherever plan_gather is, AVSG_NPU_SPLIT=1)
        from ...buffer import lookup_split
        split = lookup_split(int(hw["aiv_cores"]), batch, T * K,
                             traffic.capacity if traffic is not None else 0)
        plan_us, beside_us = costs.plan(mode, T, split)
    else:
        # avsg-apart: the plan as a launch of its own (its slowest block whole, not plan_gather's
        # blocks meeting after the publish; before avsg doctor, so no split) where measured,
        # else avsg's
        plan_us, beside_us = costs.plan_us.get(mode, costs.plan_us[priced_as(mode)])[T], 0.0
    match = waves * plan_us * 1e-6
    overlaps = mode in ("lru-device", "slotmap-device") or (overlap_avsg and mode == "avsg")
    if overlaps or mode != "avsg":
        # --overlap: avsg's copy beside attention, on a stream of its own: plan and copy are two
        # launches, no plan_gather SyncAll; avsg-apart: the two launches, the copy after the plan
        # on the main stream (--overlap or not)
        return {"match_s": match, "copy_s": max(0.0, link - mla_s) if overlaps else link}
    # avsg's serving step is one plan_gather: its SyncAll, and, where every row has a core of its
    # own and its default copy cores (copy_cores_beside_plan) leave the owners out, the copy on
    # those cores while the owners finish their rows after publishing the misses (AFTER_PUBLISH)
    from ...buffer import copy_cores_beside_plan
    sync = hw["sync_all_cycles"] / (hw["clock_ghz"] * 1e9)
    cores = copy_cores_beside_plan(int(hw["aiv_cores"]), batch)
    if waves == 1 and cores < hw["aiv_cores"]:
        beside = beside_us * 1e-6
        exposed = max(0.0, _link_s(hw, rows * batch, fmt.row_bytes, cores=cores) - beside)
    else:
        exposed = link
    return {"match_s": match + sync, "copy_s": exposed, "sync_s": sync}


def split_profile(c, hw: hardware.Profile, fmt: KVFormat, mla_s: float, tokens: int,
                  overlap: bool, attention_cores: Optional[int] = None,
                  gather_cores: Optional[int] = None):
    """The split's price inputs (:class:`avsg.cache.split_rule.SplitProfile`) from the hardware
    profile and this model's attention time ``mla_s`` for ``tokens`` query tokens (linear in
    the selections: ``a = mla_s / (tokens·K)``). ``attention_cores`` ``A``: the profile's
    assumed ``attention_aiv_cores`` unless given; the gather takes ``gather_cores`` ``C``, by
    default the cores the attention leaves (``aiv_cores - A``, at least 1) when ``overlap``, else
    every core (without the overlap fewer cores only slow the copy). The merge
    (``npu_attention_update``, fp32 in and out) reads two partial outputs and their LSE and
    writes one, per query token and head: its bytes over HBM."""
    from ...cache import split_rule
    P = int(hw["aiv_cores"])
    A = int(hw["attention_aiv_cores"] if attention_cores is None else attention_cores)
    if gather_cores is None:
        gather_cores = max(1, P - A) if overlap else P
    heads = c.num_attention_heads
    merge_bytes = heads * (3 * c.kv_lora_rank * 4 + 2 * 4)
    return split_rule.SplitProfile(
        aiv_cores=P, attention_cores=A, gather_cores=int(gather_cores),
        link_bytes_per_s=hw["link_bytes_per_s"], row_bytes=fmt.row_bytes,
        row_latency_s=hw["host_dma_latency_s"] / hw["dma_in_flight_per_core"],
        attention_fixed_s=hw["attention_fixed_s"],
        attention_s_per_selection=mla_s / (tokens * c.index_topk),
        merge_s_per_token=hardware.hbm_time_s(hw, merge_bytes))


def serving_split_policy(c, device, hw: Optional[hardware.Profile] = None,
                         gather_cores: Optional[int] = None, launch_s: Optional[float] = None,
                         attention_cores: Optional[int] = None):
    """The split rule's inputs for a serving core on ``device`` (``SparseOffloadManager(
    split_policy=...)``, ``step(split="auto")``): the profile the decode model prices with
    (default: the bundled one), ``c``'s attention dimensions, the gather on ``gather_cores``
    (None: every AIV core, the manager's default, which leaves none to attention: o = 0), the
    graph-captured launch cost, and the overlap established only on a device with streams
    whose profile says a measurement showed it (``split_overlap_measured``; 0 in the bundled
    profile). Expected misses: none given (the caller may set them); without an established
    overlap the rule never splits, whatever they are."""
    import torch
    from ...cache import split_rule
    hw = hw or hardware.load_profile()
    fmt = kv_format(hw)
    P = int(hw["aiv_cores"])
    profile = split_profile(c, hw, fmt, mla_time_s(c, hw, fmt, 1), 1, True, attention_cores,
                            P if gather_cores is None else min(int(gather_cores), P))
    established = torch.device(device).type == "npu" and bool(hw["split_overlap_measured"])
    return split_rule.SplitPolicy(profile, hw["launch_graph_s"] if launch_s is None else launch_s,
                                  established)


def project(c, hw: hardware.Profile, traffic: Traffic, costs: Optional[Costs], batch: int,
            context: int, cards: int, overlap_avsg: bool = False,
            modes: Sequence[str] = MODES, launch_s: Optional[float] = None,
            attention_cores: Optional[int] = None,
            gather_cores: Optional[int] = None) -> Dict[str, Dict]:
    """One modelled decode iteration per mode for ``batch`` requests per card: the main model's
    layers on 1 + n query tokens (per-layer traffic: the mean layer time over the trace's layers),
    then n draft passes of the MTP layer on one token each. Every layer of every pass pays the
    mode's launches (``launches_per_layer``) at ``launch_s`` each (default: the profile's
    ``launch_graph_s``). Infeasible modes get no times, but ``modelled_tpot_s``, what the
    iteration would take if it fitted (device-resident KV's is the floor every ratio is read
    against, wherever it fits). The split modes (``SPLIT_MODES``) take ``attention_cores`` and
    ``gather_cores`` (:func:`split_profile`) and decide per layer and pass with the serving
    core's rule (``split_rule.price``), told what avsg's one launch costs here (its copy beside
    the end of its plan, its SyncAll: ``unsplit_copy_s``), which the serving core's
    ``choose_split`` is not."""
    if launch_s is None:
        launch_s = hw["launch_graph_s"]
    fmt = kv_format(hw)
    T = 1 + traffic.drafts
    L, K = c.num_hidden_layers, c.index_topk
    compute_s, mla_s = _compute_layer_s(c, hw, fmt, batch, batch * T, context, cards)
    draft_s, _ = _compute_layer_s(c, hw, fmt, batch, batch, context, cards)   # drafts overlap no copies
    out = {}
    for mode in modes:
        if mode in SPLIT_MODES:
            if "avsg" in traffic.rows:
                out[mode] = _project_split(c, hw, fmt, traffic, costs, batch, context, cards, mode,
                                           launch_s, compute_s, mla_s, draft_s, attention_cores,
                                           gather_cores)
            continue
        priced = priced_as(mode)
        if priced not in traffic.rows and mode not in ("device",):
            continue
        mem = memory_per_card(c, hw, mode, batch, context, T, traffic.capacity,
                              traffic.topk_buffer, cards)
        rec = {"feasible": bool(mem["feasible"]), "memory": mem,
               "h2d_bytes_per_token": (L * traffic.mean(priced) * fmt.row_bytes
                                       / traffic.tokens_per_iteration) if mode != "device" else 0.0}
        if costs is None and mode not in ("device", "offload"):
            continue
        if mode.startswith("fused") and mode not in traffic.fused:
            continue
        per_layer = []
        for rows in (traffic.rows[priced] if mode != "device" else [0.0]):
            o = layer_overhead_s(mode, hw, fmt, costs, rows, batch, T, K, mla_s, overlap_avsg,
                                 traffic, context)
            per_layer.append((o["match_s"], o["copy_s"], o.get("sync_s", 0.0)))
        match_s = float(np.mean([m for m, _, _ in per_layer]))
        copy_s = float(np.mean([cp for _, cp, _ in per_layer]))
        sync_s = float(np.mean([sy for _, _, sy in per_layer]))
        # a draft pass: one token per request through the MTP layer, its share of the plan and
        # the copies; a launch's SyncAll whole (every pass launches)
        launches = launches_per_layer(mode)
        launch_layer_s = launches * launch_s
        draft = traffic.drafts * (draft_s + (match_s - sync_s + copy_s) / T + sync_s + launch_layer_s)
        step = L * (compute_s + match_s + copy_s + launch_layer_s) + draft
        rec.update(step_s=step, compute_s=L * compute_s, match_s=L * match_s, copy_s=L * copy_s,
                   draft_s=draft, launches_per_layer=launches, launch_us=1e6 * launch_s,
                   launch_s=(L + traffic.drafts) * launch_layer_s,
                   plan_us_per_layer=1e6 * match_s,
                   rows_per_layer=traffic.mean(priced) if mode != "device" else 0.0)
        _times(rec, step, batch, traffic)
        out[mode] = rec
    return out


def _times(rec: Dict, step: float, batch: int, traffic: Traffic) -> None:
    """TPOT and throughput where the mode fits one card (else None); the modelled TPOT always."""
    rec["modelled_tpot_s"] = step / traffic.tokens_per_iteration
    if rec["feasible"]:
        rec["tpot_s"] = rec["modelled_tpot_s"]
        rec["tokens_per_s"] = batch * traffic.tokens_per_iteration / step
    else:
        rec["tpot_s"] = rec["tokens_per_s"] = None


def _project_split(c, hw, fmt: KVFormat, traffic: Traffic, costs: Optional[Costs], batch: int,
                   context: int, cards: int, mode: str, launch_s: float, compute_s: float,
                   mla_s: float, draft_s: float, attention_cores: Optional[int],
                   gather_cores: Optional[int]) -> Dict:
    """avsg with the split where ``split_rule.price`` chooses it, per trace layer, for the main
    pass (``batch`` requests x T tokens, the layer's misses) and each draft pass (one token per
    request, its share of the misses, as avsg's draft pass is priced). A chosen split replaces
    avsg's exposed copy by the split's copy, attentions and merge (``split_s - unsplit_s``
    beside avsg's copy) and adds its launches."""
    from ...cache import split_rule
    overlap = SPLIT_MODES[mode]
    T = 1 + traffic.drafts
    L, K = c.num_hidden_layers, c.index_topk
    mem = memory_per_card(c, hw, mode, batch, context, T, traffic.capacity, traffic.topk_buffer,
                          cards)
    rec = {"feasible": bool(mem["feasible"]), "memory": mem,
           "h2d_bytes_per_token": (L * traffic.mean("avsg") * fmt.row_bytes
                                   / traffic.tokens_per_iteration)}
    if costs is None:
        return rec
    profile = split_profile(c, hw, fmt, mla_s, batch * T, overlap, attention_cores, gather_cores)
    from ...cache import manager
    base = launches_per_layer("avsg")
    added = manager.split_added_launches()      # the split's launches beside avsg's fused step
    per_layer = []
    for rows in traffic.rows["avsg"]:
        o = layer_overhead_s("avsg", hw, fmt, costs, rows, batch, T, K, mla_s, False, traffic,
                             context)
        passes = []
        # the main pass, then one draft pass (its share of the copies; avsg's convention)
        # the rule weighs the split (plan and gather apart) against avsg's one launch as priced
        # here: its copy beside the end of the plan, and its SyncAll, which a split layer does
        # not pay (so extra takes it back out of match_s)
        for tokens_per_row, misses, share in ((T, rows * batch, 1.0), (1, rows * batch / T, 1.0 / T)):
            unsplit_copy = o["copy_s"] * share
            forced = split_rule.price(profile, batch, tokens_per_row, K, misses, launch_s, overlap,
                                      added, unsplit_copy + o["sync_s"])
            extra = forced.split_s - forced.unsplit_s - added * launch_s
            passes.append({"copy": unsplit_copy + (extra if forced.chosen else 0.0),
                           "forced_copy": unsplit_copy + extra,
                           "launches": base + forced.launches,
                           "forced_launches": base + added,
                           "chosen": forced.chosen, "gain": forced.gain_s,
                           "overlap": forced.overlap})
        per_layer.append((o["match_s"], passes, o["sync_s"]))
    mean = lambda f: float(np.mean([f(m, p) for m, p, _ in per_layer]))  # noqa: E731
    match_s = mean(lambda m, p: m)
    sync_s = float(np.mean([sy for _, _, sy in per_layer]))
    steps = {}
    for key, copy, launches in (("chosen", "copy", "launches"),
                                ("forced", "forced_copy", "forced_launches")):
        main_copy = mean(lambda m, p: p[0][copy])
        draft_copy = mean(lambda m, p: p[1][copy])
        main_launches = mean(lambda m, p: p[0][launches])
        draft_launches = mean(lambda m, p: p[1][launches])
        draft = traffic.drafts * (draft_s + (match_s - sync_s) / T + sync_s + draft_copy
                                  + draft_launches * launch_s)
        step = L * (compute_s + match_s + main_copy + main_launches * launch_s) + draft
        steps[key] = (step, main_copy, draft, main_launches, draft_launches)
    step, main_copy, draft, main_launches, draft_launches = steps["chosen"]
    rec.update(step_s=step, compute_s=L * compute_s, match_s=L * match_s, copy_s=L * main_copy,
               draft_s=draft, launches_per_layer=main_launches,
               draft_launches_per_layer=draft_launches, launch_us=1e6 * launch_s,
               launch_s=(L * main_launches + traffic.drafts * draft_launches) * launch_s,
               plan_us_per_layer=1e6 * match_s, rows_per_layer=traffic.mean("avsg"),
               split={"overlap": per_layer[0][1][0]["overlap"] if per_layer else 0,
                      "attention_cores": profile.attention_cores,
                      "attention_cores_assumed": True,
                      "gather_cores": profile.gather_cores, "aiv_cores": profile.aiv_cores,
                      "layers_split": mean(lambda m, p: float(p[0]["chosen"])),
                      "draft_layers_split": mean(lambda m, p: float(p[1]["chosen"])),
                      "gain_us_per_layer": 1e6 * mean(lambda m, p: p[0]["gain"]),
                      "forced_step_s": steps["forced"][0],
                      "forced_tpot_s": steps["forced"][0] / traffic.tokens_per_iteration,
                      "forced_launches_per_layer": steps["forced"][3]})
    _times(rec, step, batch, traffic)
    return rec


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
