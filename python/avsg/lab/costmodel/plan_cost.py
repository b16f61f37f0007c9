"""Matching cost per mode: the plan kernel's counted work (CPU emulation, strict build) on a trace,
turned into time by a hardware profile; the slot map's counted-work model; the host LRU's time
per row measured on this machine (:mod:`.host_lru`).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ... import reference
from . import hardware
from .traffic import Traffic
from ..traces.lookup import load_selections

PLAN_POLICY = {"avsg": reference.DEFAULT_POLICY, "lru-device": "lru"}
# the modes priced at the op's split lookup where idle cores allow it: avsg's plan_gather runs
# with AVSG_NPU_SPLIT=1, and lru-device, the op's lru policy, is given the same
SPLIT_PRICED = tuple(PLAN_POLICY)
SPLIT_SWITCH = "AVSG_NPU_SPLIT"   # read by every plan launch (op_host/state_host.cpp ApplySplit)


# ---------------------------------------------------------------- counted matching costs

def _read_counters():
    """The last emulated launch's counted work (the one place the model reads the kernel)."""
    from ... import backend
    return backend.last_launch_counters()


def _read_phases():
    """The last emulated launch's counted work split by the kernel's phases."""
    from ... import backend
    return backend.last_launch_phases()


COUNTED_WARMUP, COUNTED_LAUNCHES = 48, 3     # plan launches before and under the counters
# MTP matching is sampled over more iterations: how many drafts were accepted (and so what the
# plan drops and misses) varies from one iteration to the next
COUNTED_MTP_LAUNCHES = 12


def counted_plan_steps(queries: int, mtp: bool, warmup: int = COUNTED_WARMUP) -> int:
    """Trace steps :func:`counted_plan` reads at ``queries`` query tokens (``mtp``: with an
    acceptance model, so COUNTED_MTP_LAUNCHES iterations)."""
    measured = COUNTED_MTP_LAUNCHES if mtp and queries > 1 else COUNTED_LAUNCHES
    return warmup + (measured + 1) * queries


def counted_plan(trace_path: str, policy: str, queries: int, capacity: int,
                 warmup: int = COUNTED_WARMUP, measured: Optional[int] = None,
                 rows: int = 2, phases: bool = False, accept_mean: Optional[float] = None,
                 split: int = 1) -> List:
    """Counters of the matching on the trace's first ``rows`` layers (see
    :func:`counted_plan_on`)."""
    sel, positions, context = load_selections(
        trace_path, rows, counted_plan_steps(queries, accept_mean is not None, warmup)
        if measured is None else warmup + (measured + 1) * queries)
    return counted_plan_on(sel, positions, int(context), policy, queries, capacity, warmup,
                           measured, phases=phases, accept_mean=accept_mean, split=split)


def counted_plan_on(sel: np.ndarray, positions: np.ndarray, context: int, policy: str,
                    queries: int, capacity: int, warmup: int = COUNTED_WARMUP,
                    measured: Optional[int] = None, phases: bool = False,
                    accept_mean: Optional[float] = None, split: int = 1) -> List:
    """Counters of ``measured`` matching iterations of the real kernels (strict emulation, one row
    per emulated core: ``sel`` int [rows, steps, K]), ``queries`` query tokens per row from
    consecutive steps, after uncounted iterations (fast emulation) over ``warmup`` steps so the
    buffers are warm. ``split`` > 1: the plan as ``AVSG_NPU_SPLIT=1`` launches it where the
    cores give each row ``split`` (``buffer.lookup_split``): on ``rows * split`` emulated cores,
    block ``b`` working on row ``b % rows``; every counted launch is checked to have that many
    blocks.

    Two kinds of iteration:

    * ``accept_mean=None``: the plan kernel alone, every draft accepted (iterations ``queries``
      steps apart), nothing invalidated: what ``avsg bench plan`` measures.
    * ``accept_mean`` given (0 at one query token): what the serving manager launches per layer
      and pass (:mod:`..cache.manager`), on the copies' MTP schedule. Accepted drafts are
      drawn as the copy traffic draws them (:func:`..traces.mtp.draw_accepted`, seed 0):
      iteration ``i`` plans steps ``s .. s + queries - 1``, the verifier accepts ``a_i`` drafts,
      the buffer drops the rejected ones' positions (``valid_len = positions[s] + 1 + a_i``, as
      :func:`.traffic.measure_traffic` does) and the next iteration starts at ``s + 1 + a_i``.
      The manager drops in every pass, rejected drafts or not (knowing would take a host sync):
      each layer's one plan launch carries the drop (``valid_lens``: the pass's first position,
      everything at or past it is rewritten, the rejected drafts of the last pass among them),
      so every iteration's counters are that one launch's.

    ``measured`` defaults to COUNTED_LAUNCHES, or COUNTED_MTP_LAUNCHES on an MTP schedule. With
    ``phases``, each plan launch's counters split by phase (``backend.LaunchPhases``, for
    :func:`phase_breakdown`)."""
    import torch
    from ... import backend
    from ...buffer import SparseKVBuffer, lookup_split
    from ..traces.mtp import draw_accepted
    rows, steps, K = sel.shape
    if split != 1 and lookup_split(rows * split, rows, queries * K, capacity) != split:
        raise ValueError(f"split: {rows} rows of {queries} x top-{K} at capacity {capacity} "
                         f"split no lookup into {split} parts (buffer.lookup_split)")
    serving = accept_mean is not None
    mtp = serving and queries > 1
    if measured is None:
        measured = COUNTED_MTP_LAUNCHES if mtp else COUNTED_LAUNCHES
    # every iteration advances >= 1 step, so warm-up takes at most ``warmup`` of them
    accepted = (draw_accepted(warmup + measured, queries - 1, accept_mean) if mtp
                else np.full(warmup + measured, queries - 1, np.int64))
    if steps < warmup + measured * queries:
        raise ValueError(f"trace: expected at least {warmup + measured * queries} steps for the "
                         f"counted plan, got {steps}")
    extra = {"max_context": int(context) + 8} if policy == "reuse" else {}
    buf = SparseKVBuffer(rows=rows, capacity=capacity, topk=K, queries_per_step=queries,
                         check=False, policy=policy, track_copies=False, **extra)
    step = iteration = 0

    def launch(counted: bool):
        nonlocal step, iteration
        topk = torch.from_numpy(np.ascontiguousarray(sel[:, step:step + queries])).to(torch.int32)
        seq = torch.full((rows,), int(positions[step + queries - 1]) + 1, dtype=torch.int32)
        # serving: every pass drops from its first position on, whatever was rejected (the
        # manager cannot know without a sync), in the plan's own launch
        drop = (torch.full((rows,), int(positions[step]), dtype=torch.int32) if serving
                else None)
        buf.plan(topk, seq, valid_lens=drop)
        work = (_read_phases() if phases else _read_counters()) if counted else None
        a = int(accepted[iteration])
        step += 1 + a
        iteration += 1
        return work
    saved = backend.emulated_cores()
    saved_switch = os.environ.get(SPLIT_SWITCH)
    backend.set_emulated_cores(rows * split)
    os.environ[SPLIT_SWITCH] = "1" if split > 1 else "0"
    try:
        with backend.emulation("fast"):
            while step + queries <= warmup:
                launch(False)
        out = []
        with backend.emulation("strict"):
            for _ in range(measured):
                if step + queries > steps:
                    raise ValueError(f"trace: {steps} steps are too few for {measured} counted "
                                     f"iterations after {warmup} warm-up steps")
                out.append(launch(True))
    finally:
        backend.set_emulated_cores(saved)
        if saved_switch is None:
            os.environ.pop(SPLIT_SWITCH, None)
        else:
            os.environ[SPLIT_SWITCH] = saved_switch
    for work in out:
        blocks = int(work.per_block.shape[0])
        if blocks != rows * split:
            raise RuntimeError(f"the counted plan ran on {blocks} blocks, expected {rows} rows x "
                               f"{split} (buffer.lookup_split disagrees with the op's split)")
    return out


#: The plan's phases after its miss lists are published (op_kernel/plan/plan_phases.h): what a
#: row's owner block still does while plan_gather's copy runs on the other blocks.
AFTER_PUBLISH = ("lives back", "insert", "stash pending", "output+store")
#: From the split lookup's SyncAll to the publish: the row's owner alone, once every part of the
#: row's lookup is in (a helper block's share here is only the SyncAll itself).
AFTER_PARTS = ("split sync+fold", "merge misses", "heat", "decay+pin", "victims", "publish")


def counted_plan_us(launches: Sequence, hw: hardware.Profile, statistic: str = "mean",
                    synced: bool = False, split: int = 1) -> Tuple[float, float]:
    """``(plan, after_publish)`` of counted plan launches (``backend.LaunchPhases`` each, from
    ``counted_plan_on(..., phases=True, split=split)``: block ``b`` works on row
    ``b % (blocks // split)``), serial-pipe us, the median or the ``"mean"`` over the launches.

    Per row: its lookup (the phases before AFTER_PARTS), then its owner's AFTER_PARTS, then its
    AFTER_PUBLISH. With a split every block of the launch meets the others in the split's
    SyncAll (SyncParts is a SyncAll, not a barrier of the row's parts), so every owner goes on
    from the slowest lookup part of any row; without one a row's lookup is its own block's.
    ``plan``: the launch's slowest row, as the plan op runs (:func:`counted_us` prices a launch
    without a split the same way); with ``synced`` (the plan as plan_gather runs it: every block
    meets the others in a SyncAll after its publish) the slowest row up to the publish plus the
    slowest AFTER_PUBLISH, which may be two rows. ``after_publish``: the slowest AFTER_PUBLISH
    (what runs beside plan_gather's copy). plan_gather's own SyncAll is not in the counted plan
    op; the caller adds it (the split's is counted: it is the plan op's)."""
    import torch
    if statistic not in ("median", "mean"):
        raise ValueError(f"statistic: expected 'median' or 'mean', got {statistic!r}")
    plans, afters = [], []
    for launch in launches:
        blocks = int(launch.per_block.shape[0])
        if split < 1 or blocks % split:
            raise ValueError(f"split: expected a divisor of the launch's {blocks} blocks, got "
                             f"{split}")
        rows = blocks // split
        per_phase = {n: _phase_values(launch.phase(n), hw)["serial_us"] for n in launch.names}

        def summed(names):       # [split, rows]: part p of row r is block p * rows + r
            return sum((per_phase[n] for n in names if n in per_phase),
                       torch.zeros(blocks, dtype=torch.float64)).reshape(split, rows)
        parts = summed([n for n in launch.names if n not in AFTER_PUBLISH + AFTER_PARTS])
        owner, after = summed(AFTER_PARTS), summed(AFTER_PUBLISH)
        lookup = parts.max() if split > 1 else parts[0]
        before = lookup + owner.max(dim=0).values
        ends = after.max(dim=0).values
        plans.append(float(before.max() + ends.max()) if synced else float((before + ends).max()))
        afters.append(float(ends.max()))
    pick = np.median if statistic == "median" else np.mean
    return float(pick(plans)), float(pick(afters))


def counted_us(counters: Sequence, hw: hardware.Profile, statistic: str = "median") -> float:
    """Serial-pipe estimate (us per row: the launch's slowest block) of counted launches, their
    median (a typical launch) or ``"mean"`` (the expected cost: what the decode model adds up,
    since under MTP an iteration's work depends on what the verifier rejected)."""
    if statistic not in ("median", "mean"):
        raise ValueError(f"statistic: expected 'median' or 'mean', got {statistic!r}")
    us = [hardware.launch_estimate(c, hw)["serial_pipe_us"] for c in counters]
    return float(np.median(us) if statistic == "median" else np.mean(us))


PHASE_COLUMNS = ("serial_us", "scalar_us", "vector_us", "mte2_us", "mte3_us", "sync_us",
                 "mte2_bytes", "mte3_bytes", "scalar_ops", "vec_instrs", "vec_repeats",
                 "pipe_barriers")


def _phase_values(counters, hw: hardware.Profile) -> Dict[str, "object"]:
    """PHASE_COLUMNS of one phase for every block (float64 tensors ``[blocks]``)."""
    us = 1.0 / (hw["clock_ghz"] * 1e3)
    cyc = hardware.pipe_cycles(counters, hw)
    f = lambda name: counters[name].double()  # noqa: E731
    out = {f"{pipe}_us": cyc[pipe] * us for pipe in ("scalar", "vector", "mte2", "mte3", "sync")}
    out["serial_us"] = sum(out[f"{pipe}_us"] for pipe in ("scalar", "vector", "mte2", "mte3", "sync"))
    out.update(mte2_bytes=f("mte2_bytes"), mte3_bytes=f("mte3_bytes"),
               scalar_ops=f("scalar_ub_reads") + f("scalar_ub_writes") + f("scalar_gm_reads")
               + f("scalar_gm_writes"),
               vec_instrs=f("vec_instrs"), vec_repeats=f("vec_repeats"),
               pipe_barriers=f("pipe_barriers"))
    return out


def phase_breakdown(launches: Sequence, hw: hardware.Profile, blocks: str = "slowest") -> Dict:
    """Where a plan row-step's modelled time goes: per phase of the kernel (``launches``: each
    launch's ``backend.LaunchPhases``, e.g. from ``counted_plan_on(..., phases=True)``), the
    serial-pipe us, the us of each pipe (scalar, vector, MTE2, MTE3, sync) and the work behind them
    (MTE2 / MTE3 bytes, scalar accesses, vector instructions and repeats, pipe barriers).

    Samples: per launch its slowest block by serial-pipe us (``blocks="slowest"``: what the launch
    waits for) or every block (``"each"``: as ``avsg bench plan --policies`` takes its p50). Each
    value is the median over the samples, so a phase's us is its typical cost, and the phases' us
    need not add up to the median total exactly; ``share`` is a phase's us over the sum of the
    phases' us. Returns ``{"phases": [row per phase, in kernel order], "total": row}``, a row
    holding ``phase`` and PHASE_COLUMNS (the total's are medians of the samples' sums)."""
    if blocks not in ("slowest", "each"):
        raise ValueError(f"blocks: expected 'slowest' or 'each', got {blocks!r}")
    if not launches:
        raise ValueError("launches: expected at least one launch's phases")
    names = launches[0].names
    if any(launch.names != names for launch in launches):
        raise ValueError("launches: expected launches of one kernel (the same phases)")
    samples: Dict[str, Dict[str, List[float]]] = {n: {k: [] for k in PHASE_COLUMNS}
                                                  for n in (*names, "total")}
    for launch in launches:
        per_phase = {n: _phase_values(launch.phase(n), hw) for n in names}
        total = {k: sum(per_phase[n][k] for n in names) for k in PHASE_COLUMNS}
        picked = ([int(total["serial_us"].argmax())] if blocks == "slowest"
                  else range(launch.per_block.shape[0]))
        for b in picked:
            for n, values in (*per_phase.items(), ("total", total)):
                for k in PHASE_COLUMNS:
                    samples[n][k].append(float(values[k][b]))
    rows = {n: dict(phase=n, **{k: float(np.median(v)) for k, v in cols.items()})
            for n, cols in samples.items()}
    whole = sum(rows[n]["serial_us"] for n in names)
    for n in names:
        rows[n]["share"] = rows[n]["serial_us"] / whole if whole > 0 else 0.0
    rows["total"]["share"] = 1.0
    return {"phases": [rows[n] for n in names], "total": rows["total"],
            "samples": len(samples["total"]["serial_us"]), "blocks": blocks}


def slotmap_counters(selections: int, misses: float, rejected: float = 0.0):
    """Counted-work model of one row's slot-map lookup (one AIV block): the selections DMA'd in,
    one scalar read of ``slot_map[pos]`` per selection (an indexed read through the DCache: the
    cheapest form, a 4-byte DMA per selection costs ~4x more), four vector passes to mark hits
    and compact the misses, per miss one read of the FIFO victim's position, three scalar writes
    (clear the victim's entry, set the new one, the slot's position) and two cache-line flushes,
    and the slots DMA'd out. Per ``rejected`` draft position (MTP: the verifier's rejections,
    mean per row and iteration) one read of its slot and two writes to forget it, with their
    flushes: a direct map finds them without a scan. Shaped like the emulation's counters, so the
    profile prices it the way it prices the real kernels."""
    import torch
    n, m, r = float(selections), float(misses), float(rejected)
    chunks = math.ceil(4 * n / 16384)
    repeats = math.ceil(4 * n / 256)
    work = {"scalar_ub_reads": 0.0, "scalar_ub_writes": n, "scalar_gm_reads": n + m + r,
            "scalar_gm_writes": 3 * m + 2 * r, "vec_instrs": 4.0 * chunks,
            "vec_repeats": 4.0 * repeats,
            "mte2_copies": chunks, "mte2_bytes": 4 * n, "mte3_copies": chunks, "mte3_bytes": 4 * n,
            "pipe_barriers": 4.0, "set_flags": 2.0 * chunks, "wait_flags": 2.0 * chunks,
            "queue_syncs": 0.0, "sync_alls": 0.0, "dcci": 2 * m + 2 * r}

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
    # mode -> T -> us of plan_us after the plan publishes its miss lists (AFTER_PUBLISH): where the
    # plan and its copy are one launch (avsg's plan_gather), the copy runs beside it. Absent: 0.
    after_publish_us: Dict[str, Dict[int, float]] = dataclasses.field(default_factory=dict)
    # the op's plan with its lookup split over idle cores (buffer.lookup_split, AVSG_NPU_SPLIT=1:
    # on wherever avsg's plan_gather is), per mode of SPLIT_PRICED: mode -> (T, split) ->
    # (plan, after_publish) us per row. None: costs counted without the split, so every mode is
    # priced one core per row at every batch.
    split_plan_us: Optional[Dict[str, Dict[Tuple[int, int], Tuple[float, float]]]] = None

    def plan(self, mode: str, T: int, split: int = 1) -> Tuple[float, float]:
        """``(plan, after_publish)`` us per row of ``mode`` at ``T`` query tokens, its lookup
        split ``split`` ways (without ``split_plan_us``, one core per row)."""
        if split == 1 or self.split_plan_us is None:
            return self.plan_us[mode][T], self.after_publish_us.get(mode, {}).get(T, 0.0)
        counted = self.split_plan_us.get(mode, {})
        if (T, split) not in counted:
            raise ValueError(f"split: no counted {mode} plan at T = {T} with its lookup split "
                             f"{split} ways (counted: {sorted(counted)})")
        return counted[(T, split)]


def serving_splits(cores: int, batches: Sequence[int], Ts: Sequence[int], k: int,
                   capacity: int) -> Dict[int, List[int]]:
    """T -> the lookup splits above 1 (``buffer.lookup_split``) the op's plan runs at for
    ``batches`` rows on ``cores`` cores: the counted plans the decode model needs."""
    from ...buffer import lookup_split
    return {T: sorted({lookup_split(cores, b, T * k, capacity) for b in batches} - {1})
            for T in Ts}


def measure_costs(trace_path: str, Ts: Sequence[int], capacity: int, topk_buffer: int,
                  traffic: Dict[int, Traffic], hw: hardware.Profile,
                  counters: Optional[Dict] = None) -> Costs:
    """Costs under ``hw``; ``counters`` (from :func:`plan_counters`) are profile-independent, and
    give avsg's split plans where they hold them."""
    counters = counters or plan_counters(trace_path, Ts, capacity, topk_buffer,
                                         {T: traffic[T - 1].accept_mean for T in Ts})
    plan_us: Dict[str, Dict[int, float]] = {m: {} for m in ("avsg", "lru-device", "slotmap-device")}
    after: Dict[str, Dict[int, float]] = {m: {} for m in PLAN_POLICY}
    plan_us["avsg-apart"] = {}
    for T in Ts:
        for mode, policy in PLAN_POLICY.items():
            # avsg's serving step is plan_gather: its blocks meet after the publish
            plan_us[mode][T], after[mode][T] = counted_plan_us(counters[(policy, T)], hw, "mean",
                                                               synced=mode == "avsg")
        # before avsg doctor on an NPU the plan is a launch of its own (projection.APART_MODE)
        plan_us["avsg-apart"][T] = counted_plan_us(counters[(PLAN_POLICY["avsg"], T)], hw,
                                                   "mean")[0]
        K = counters["k"]
        tr = traffic[T - 1]
        plan_us["slotmap-device"][T] = hardware.launch_estimate(
            slotmap_counters(T * K, tr.mean("slotmap-device"), tr.drafts - tr.accept_mean),
            hw)["serial_pipe_us"]
    split_plan = {mode: {(T, split): counted_plan_us(launches, hw, "mean",
                                                     synced=mode == "avsg", split=split)
                         for (policy, T, split), launches in counters.get("split", {}).items()
                         if policy == PLAN_POLICY[mode]}
                  for mode in SPLIT_PRICED}
    host = counters["host"]
    return Costs(plan_us, host["us_per_row"] * hw["host_cpu_time_factor"],
                 f"host LRU timed on this machine: {host['us_per_row']:.1f} us per query-token "
                 f"row (median of {host['calls']} calls x {host['rows']} rows, {host['capacity']} "
                 f"slots, K {host['k']}), x {hw['host_cpu_time_factor']:g} (host_cpu_time_factor)",
                 after, split_plan)


def plan_counters(trace_path: str, Ts: Sequence[int], capacity: int,
                  topk_buffer: int = 4096,
                  accept_means: Optional[Dict[int, float]] = None,
                  splits: Optional[Dict[int, Sequence[int]]] = None) -> Dict:
    """The op's counted matching per policy and T, as the serving manager launches it (a
    plan carrying the drop per layer and pass, on the MTP schedule of ``accept_means``: T -> mean
    accepted drafts, needed for every T > 1; see :func:`counted_plan_on`), the host LRU's
    time per row, timed here, and under ``"split"`` the plan with its lookup split, keyed
    ``(policy, T, split)`` for every split in ``splits[T]`` (:func:`serving_splits`), for the
    policies of SPLIT_PRICED."""
    from . import host_lru
    out: Dict = {}
    for T in Ts:
        accept = (accept_means or {}).get(T, 0.0 if T == 1 else None)
        if accept is None:
            raise ValueError(f"accept_means: expected the mean accepted drafts at T = {T}")
        for policy in sorted(set(PLAN_POLICY.values())):
            out[(policy, T)] = counted_plan(trace_path, policy, T, capacity, accept_mean=accept,
                                            phases=True)
        for split in (splits or {}).get(T, ()):
            for policy in sorted({PLAN_POLICY[m] for m in SPLIT_PRICED}):
                out.setdefault("split", {})[(policy, T, split)] = counted_plan(
                    trace_path, policy, T, capacity, accept_mean=accept, phases=True,
                    split=split)
    from ..traces import format as trace_format
    layers = trace_format.load_trace(trace_path, check_values=False).layers
    sel, positions, context = load_selections(trace_path, layers, 48)
    out["k"] = int(sel.shape[2])
    out["host"] = host_lru.time_per_row_us(sel, positions, topk_buffer, int(context) + 8)
    return out


def replay_step_cost(result, hw: hardware.Profile, batches=(1, 64)) -> Optional[Dict]:
    """The modelled cost of one layer's step of a trace replay (a ``ReplayResult`` run with
    ``cost_every``, so it holds counted plan launches; None without them): the plan's µs per row-step (median over the sampled launches and their cores, one row
    per core, serial- and overlapped-pipe), the link µs of a row's misses at the profile's
    link (``hardware.link_time_s``), and per batch ``B`` their sum: rows plan in parallel,
    ``ceil(B / aiv_cores)`` waves, and the batch's misses share the link."""
    if not result.cost_counters:
        return None
    serial, overlapped = [], []
    for counters in result.cost_counters:
        est = hardware.launch_estimate(counters, hw)
        serial.extend(est["serial_per_block_us"])
        overlapped.extend(est["overlapped_per_block_us"])
    plan_us = float(np.median(serial))
    out = {"plan_us_serial": plan_us, "plan_us_overlapped": float(np.median(overlapped)),
           "plan_samples": len(serial), "misses_per_row_step": result.misses_per_row_step,
           "entry_bytes": result.entry_bytes}
    out["link_us_per_row"] = 1e6 * hardware.link_time_s(hw, result.misses_per_row_step,
                                                        result.entry_bytes)
    cores = int(hw["aiv_cores"])
    for b in batches:
        link = 1e6 * hardware.link_time_s(hw, b * result.misses_per_row_step, result.entry_bytes)
        out[f"step_us_batch{b}"] = -(-b // cores) * plan_us + link
        out[f"link_us_batch{b}"] = link
    return out
