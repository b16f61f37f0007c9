"""``avsg bench calibrate``: microbenchmarks on an Ascend NPU that write a hardware profile.

NPU only, and UNVERIFIED: written from the CANN / torch_npu documentation, never run (no NPU was
available to this project). With torch.npu.Event it times:

* the gather kernel, one row per DMA: a DMA size sweep, 64 B to 64 KB rows, from HBM (a
  device-resident pool) and from mapped host memory (a pool from avsg.backend.alloc_host_pool,
  registered with register_host_pool), on one core (per-DMA latency: the time per row at the
  smallest size) and on every core (bandwidth: bytes per second at the largest size);
* the calibration microkernel (torch.ops.avsg.calibrate, op_kernel/calibrate_kernel.h) on one
  core, for several iteration counts n per mode: a dependent scalar loop over UB values, and
  repeats of the plan kernel's own Gather, Sort and GatherMask calls (same shapes and dtypes).
  The slope of time against n is the cost of one iteration, launch overhead the intercept. The
  same kernel on the CPU emulation gives the work each iteration counts (its scalar UB accesses,
  vector instructions and 256 B repeats), and the ratio gives the constants the cost model
  multiplies those counts by: scalar_ub_cycles from the scalar loop; vec_issue_cycles and
  vec_cycles_per_repeat by a non-negative least-squares fit over the three vector modes (after the
  modelled cost of each iteration's PipeBarrier). Cycles use the profile's clock_ghz, which the
  model divides by again, so that assumption cancels. Each mode's checksum is compared with a
  Python golden, and a mismatch is reported.

The plan kernel itself is not timed here: the decode model reads its cost from the counted work.

It writes a profile JSON (``--out``, default avsg-results/bench-calibrate/profile.json) with the
measured entries replaced, each source saying "measured by avsg bench calibrate on <device>", and
every other entry kept as the bundled assumption; pass it to any benchmark with ``--hw``.

``--emulate`` runs the microkernels on the CPU emulation instead (no NPU needed) and prints the
work each iteration counts, checking every checksum against the golden: counts, not a
calibration; nothing is timed and no profile is written.
"""
from __future__ import annotations

import argparse
import datetime
import json
from typing import Dict, List

import torch

from .... import _ops, backend
from ...costmodel import hardware
from . import common
from ....cli_util import int_in

SIZES = [64 << i for i in range(11)]   # 64 B .. 64 KB
READS_IN_FLIGHT = 4                    # kGatherCopyBuffers

# ------------------------------------------------------------------ calibration microkernel
MODES = ("scalar", "gather", "sort", "gathermask")
MODE_IDS = {m: i for i, m in enumerate(MODES)}   # op_host/calibrate_tiling.h CalibrateMode
TABLE_LEN = 4096
HEADER = 8
EMULATE_ITERS = (4, 8, 16)
# NPU iteration counts: long enough that the largest launch is well above launch overhead
# (scalar ~ns per step, the vector modes ~tens of ns), yet a few ms at most.
NPU_ITERS = {"scalar": (25000, 50000, 100000, 200000), "gather": (1000, 2000, 4000, 8000),
             "sort": (250, 500, 1000, 2000), "gathermask": (1000, 2000, 4000, 8000)}
WORK_FIELDS = ("scalar_ub_reads", "scalar_ub_writes", "scalar_gm_reads", "scalar_gm_writes",
               "vec_instrs", "vec_repeats", "mte2_copies", "mte3_copies", "pipe_barriers",
               "set_flags", "wait_flags")


def microkernel_values(length: int = TABLE_LEN, seed: int = 0) -> torch.Tensor:
    """The microkernel's input: a permutation of [-L/2, L/2) (distinct sort keys, both signs for
    the two GatherMask masks; modulo L it is a permutation, so the chains never collapse)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(length, generator=g) - length // 2).to(torch.int32)


def _i32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def golden(values: torch.Tensor, mode: str, iters: int) -> torch.Tensor:
    """What torch.ops.avsg.calibrate(values, mode, iters) returns, computed in Python."""
    v = values.to(torch.int64).cpu()
    L, W, nc = v.numel(), _ops.CALIB_GATHER_LANES, _ops.CALIB_VECTOR_LANES
    out = torch.zeros(_ops.CALIB_OUT_LEN, dtype=torch.int64)
    a = b = 0
    table = (v & (L - 1)).tolist()
    if mode == "scalar":
        idx = acc = 0
        for _ in range(iters):
            idx = table[idx]
            acc += idx
        a, b = idx, acc
    elif mode == "gather":
        t = v & (L - 1)
        cur = t[:W]
        for _ in range(iters):
            cur = t[cur]
        out[HEADER:HEADER + W] = 4 * cur
    elif mode == "sort":
        keys = v[:nc].to(torch.float32)
        vals, idx = torch.sort(keys, descending=True, stable=True)
        out[HEADER:HEADER + nc] = vals.view(torch.int32).to(torch.int64)
        out[HEADER + nc:HEADER + 2 * nc] = idx
    elif mode == "gathermask":
        src = v[:nc]
        masks = (src >= 0, src < 0)
        counts = [int(m.sum()) for m in masks]
        a = counts[0] * ((iters + 1) // 2) + counts[1] * (iters // 2)
        last = masks[(iters - 1) & 1]
        b = counts[(iters - 1) & 1]
        out[HEADER:HEADER + b] = src[last]
    else:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    out[0], out[1], out[2], out[3] = _i32(a), _i32(b), _i32(iters), MODE_IDS[mode]
    return out.to(torch.int32)


def emulated_work(mode: str, values: torch.Tensor, iters=EMULATE_ITERS) -> Dict:
    """Run the microkernel on the strict CPU emulation for each n in ``iters``: the counted work
    of one iteration (slope over n), whether every count is exactly linear in n, and whether each
    checksum equals the golden."""
    per_n, checks = [], []
    with backend.emulation("strict"):
        for n in iters:
            out = torch.ops.avsg.calibrate(values, mode, n)
            c = backend.last_launch_counters()
            row = {f: int(c[f].sum()) for f in WORK_FIELDS}
            for api, t in c.vector_apis.items():
                row[f"{api} instrs"] = int(t[:, 0].sum())
                row[f"{api} repeats"] = int(t[:, 1].sum())
            per_n.append(row)
            checks.append(bool(torch.equal(out, golden(values, mode, n))))
    keys = sorted({k for row in per_n for k in row})
    n0, n1 = iters[0], iters[-1]
    slope = {k: (per_n[-1].get(k, 0) - per_n[0].get(k, 0)) / (n1 - n0) for k in keys}
    linear = all(per_n[i].get(k, 0) == per_n[0].get(k, 0) + slope[k] * (n - n0)
                 for i, n in enumerate(iters) for k in keys)
    return dict(mode=mode, iters=list(iters), counts=per_n,
                per_iter={k: v for k, v in slope.items() if v}, linear=linear,
                checksum_ok=all(checks))


def modelled_cycles(per_iter: Dict[str, float], hw: hardware.Profile) -> Dict[str, float]:
    """Cycles per pipe the profile's cost model charges for one iteration's counted work."""
    class _Row(dict):   # every counter pipe_cycles asks for; the ones not counted are zero
        def __missing__(self, field):
            return torch.tensor([float(per_iter.get(field, 0.0))])
    return {k: float(v[0]) for k, v in hardware.pipe_cycles(_Row(), hw).items()}


def fit_line(xs: List[float], ys: List[float]):
    """Least-squares slope and intercept of ys against xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def fit_vector_constants(rows: List[Dict]) -> Dict[str, float]:
    """vec_issue_cycles and vec_cycles_per_repeat, both >= 0, that best explain each row's
    ``cycles`` as instrs * issue + repeats * per_repeat (least squares, all rows weighed alike)."""
    def sse(a, b):
        return sum((r["cycles"] - a * r["instrs"] - b * r["repeats"]) ** 2 for r in rows)
    X = torch.tensor([[r["instrs"], r["repeats"]] for r in rows], dtype=torch.float64)
    y = torch.tensor([[r["cycles"]] for r in rows], dtype=torch.float64)
    cands = []
    sol = torch.linalg.lstsq(X, y).solution.flatten().tolist()
    if min(sol) >= 0:
        cands.append((sol[0], sol[1]))
    # the non-negative optimum otherwise lies on an axis
    ii = sum(r["instrs"] ** 2 for r in rows)
    rr = sum(r["repeats"] ** 2 for r in rows)
    cands.append((max(0.0, sum(r["cycles"] * r["instrs"] for r in rows) / ii) if ii else 0.0, 0.0))
    cands.append((0.0, max(0.0, sum(r["cycles"] * r["repeats"] for r in rows) / rr) if rr else 0.0))
    a, b = min(cands, key=lambda ab: sse(*ab))
    return {"vec_issue_cycles": a, "vec_cycles_per_repeat": b,
            "rms_residual_cycles": (sse(a, b) / len(rows)) ** 0.5}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_in(1, 1 << 20), default=4096,
                        help="rows copied per timed launch, 1..1048576 (default 4096)")
    parser.add_argument("--iters", type=int_in(1, 10000), default=10,
                        help="timed launches per point, 1..10000 (default 10)")
    parser.add_argument("--warmup", type=int_in(0, 10000), default=3,
                        help="untimed launches per point, 0..10000 (default 3)")
    parser.add_argument("--hw", metavar="JSON", default=hardware.DEFAULT_PROFILE,
                        help="profile whose unmeasured entries are kept (default the bundled 910B one)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help=f"directory for profile.json and the sweep (default {common.default_out('calibrate')}/)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--emulate", action="store_true",
                        help="run the calibration microkernels on the CPU emulation (no NPU needed) and "
                             "print the work one iteration counts: counts, not a calibration")


def _sweep(where: str, cores: int, args) -> List[Dict]:
    dev = torch.device("npu")
    out = []
    for size in SIZES:
        n = args.rows
        # every other host row: no two misses are contiguous, so each row is its own read
        if where == "host":
            src = backend.alloc_host_pool((1, 2 * n, size), torch.uint8)
            backend.register_host_pool(src)
        else:
            src = torch.empty((1, 2 * n, size), dtype=torch.uint8, device=dev)
        dst = torch.empty((1, n, size), dtype=torch.uint8, device=dev)
        pos = (2 * torch.arange(n, dtype=torch.int32, device=dev)).view(1, n)
        slots = torch.randperm(n, device="cpu").to(torch.int32).view(1, n).to(dev)  # no merged runs
        cnt = torch.tensor([n], dtype=torch.int32, device=dev)
        times = common.npu_time_us(lambda: torch.ops.avsg.gather(pos, slots, cnt, [src], [dst], None, 0,
                                                                 "miss", cores),
                                   args.warmup, args.iters)
        med = sorted(times)[len(times) // 2]
        out.append(dict(where=where, cores=cores, row_bytes=size, rows=n, us=med,
                        gbps=n * size / (med * 1e-6) / 1e9, us_per_row=med / n))
        if where == "host":
            backend.unregister_host_pool(src)
    return out


def _per_iter_row(w: Dict) -> Dict[str, float]:
    p = w["per_iter"]
    apis = sorted({k.rsplit(" ", 1)[0] for k in p if k.endswith(" instrs")})
    return dict(scalar_ub=p.get("scalar_ub_reads", 0) + p.get("scalar_ub_writes", 0),
                instrs=p.get("vec_instrs", 0), repeats=p.get("vec_repeats", 0),
                barriers=p.get("pipe_barriers", 0),
                apis=", ".join(f"{a} {p[a + ' instrs']:g}x{p.get(a + ' repeats', 0) / p[a + ' instrs']:g}"
                               for a in apis))


def main_emulate(args: argparse.Namespace, hw: hardware.Profile) -> int:
    out = common.out_dir(args, "calibrate")
    values = microkernel_values()
    works = [emulated_work(m, values) for m in MODES]
    print("avsg bench calibrate --emulate: the calibration microkernels on the CPU emulation (strict "
          "build), one core.")
    print("COUNTS, NOT A CALIBRATION: nothing is timed and no profile is written; on an NPU, "
          "'avsg bench calibrate' times these kernels and divides by these counts.")
    print(f"{'mode':<11} {'scalar UB':>9} {'vec instrs':>10} {'vec repeats':>11} {'barriers':>8} "
          f"{'model cyc':>9}  {'linear':<6} {'checksum':<8} vector APIs (instrs x repeats)")
    for w in works:
        r = _per_iter_row(w)
        model = modelled_cycles(w["per_iter"], hw)
        w["model_cycles_per_iter"] = model
        print(f"{w['mode']:<11} {r['scalar_ub']:>9g} {r['instrs']:>10g} {r['repeats']:>11g} "
              f"{r['barriers']:>8g} {sum(model.values()):>9g}  {'yes' if w['linear'] else 'NO':<6} "
              f"{'ok' if w['checksum_ok'] else 'MISMATCH':<8} {r['apis'] or '-'}")
    print(f"per iteration, slope over n = {', '.join(map(str, EMULATE_ITERS))}; 'model cyc': the serial-pipe "
          f"cycles {hw.name} charges for it (assumed constants)")
    files = {"counts JSON": common.write_json(f"{out}/emulated_counts.json",
                                              dict(note="counts, not a calibration", profile=hw.path,
                                                   modes=works))}
    common.report_outputs(files)
    bad = [w["mode"] for w in works if not (w["linear"] and w["checksum_ok"])]
    if bad:
        print(f"FAILED: {', '.join(bad)}: a count not linear in n, or a checksum unlike the golden")
        return 1
    return 0


def microkernel_profile(hw: hardware.Profile, stamp: str, time_us, device: str = "npu",
                        iters_by_mode: Dict = NPU_ITERS) -> Dict:
    """Time each microkernel mode (``time_us(values, mode, n)``: median us of one launch) over
    ``iters_by_mode``, fit the per-iteration cycles, and derive the cost model's scalar and vector
    constants from the emulation's counts. Returns the per-mode figures, the fit and the profile
    entries. Tests pass a synthetic ``time_us`` on CPU; on an NPU it is ``_npu_median_us``."""
    values_cpu = microkernel_values()
    values = values_cpu.to(device)
    clock_hz = hw["clock_ghz"] * 1e9
    modes = {}
    for mode in MODES:
        ns = iters_by_mode[mode]
        med = [time_us(values, mode, n) for n in ns]
        slope_us, intercept_us = fit_line(list(ns), med)
        got = torch.ops.avsg.calibrate(values, mode, ns[-1]).cpu()
        work = emulated_work(mode, values_cpu)
        modes[mode] = dict(iters=list(ns), median_us=med, us_per_iter=slope_us, intercept_us=intercept_us,
                           cycles_per_iter=slope_us * 1e-6 * clock_hz, per_iter_counts=work["per_iter"],
                           counts_linear=work["linear"],
                           checksum_ok=bool(torch.equal(got, golden(values_cpu, mode, ns[-1]))))
    entries = {}
    s = modes["scalar"]
    ub = _per_iter_row(dict(per_iter=s["per_iter_counts"]))["scalar_ub"]
    entries["scalar_ub_cycles"] = {
        "value": s["cycles_per_iter"] / ub,
        "source": f"{stamp}: scalar microkernel (a dependent chain of UB reads, loop overhead included), "
                  f"one core, slope over n = {s['iters']}, cycles at clock_ghz {hw['clock_ghz']:g}"}
    rows = []
    for mode in ("gather", "sort", "gathermask"):
        m = modes[mode]
        r = _per_iter_row(dict(per_iter=m["per_iter_counts"]))
        # the iteration's PipeBarrier stays charged by barrier_cycles, as in the model
        rows.append(dict(mode=mode, instrs=r["instrs"], repeats=r["repeats"],
                         cycles=m["cycles_per_iter"] - r["barriers"] * hw["barrier_cycles"]))
    fit = fit_vector_constants(rows)
    what = (f"non-negative least squares over the gather, sort and gathermask microkernels (the plan's "
            f"calls; one core), their per-iteration cycles less barrier_cycles against counted vector "
            f"instructions and 256 B repeats, rms residual {fit['rms_residual_cycles']:.1f} cycles")
    entries["vec_issue_cycles"] = {"value": fit["vec_issue_cycles"], "source": f"{stamp}: {what}"}
    entries["vec_cycles_per_repeat"] = {"value": fit["vec_cycles_per_repeat"], "source": f"{stamp}: {what}"}
    for mode, m in modes.items():
        entries[f"calib_{mode}_cycles_per_iter"] = {
            "value": m["cycles_per_iter"],
            "source": f"{stamp}: calibration microkernel mode {mode!r}, one core, slope over n = {m['iters']} "
                      f"(not read by the cost model; the per-API figure behind the fit)"}
    return dict(modes=modes, fit=fit, entries=entries)


def _npu_median_us(values, mode: str, n: int, args) -> float:
    times = common.npu_time_us(lambda: torch.ops.avsg.calibrate(values, mode, n), args.warmup, args.iters)
    return sorted(times)[len(times) // 2]


def main(args: argparse.Namespace) -> int:
    common.at_least("--rows", args.rows)
    common.at_least("--iters", args.iters)
    common.at_least("--warmup", args.warmup, 0)
    hw = common.load_hw(args)
    if args.emulate:
        return main_emulate(args, hw)
    common.require_npu("calibrate")
    out = common.out_dir(args, "calibrate")
    cores = int(hw["aiv_cores"])
    sweep = []
    for where in ("hbm", "host"):
        for c in (1, cores):
            sweep += _sweep(where, c, args)
    one = {s["where"]: s for s in sweep if s["cores"] == 1 and s["row_bytes"] == SIZES[0]}
    full = {s["where"]: s for s in sweep if s["cores"] == cores and s["row_bytes"] == SIZES[-1]}
    stamp = f"measured by avsg bench calibrate on {torch.npu.get_device_name()} {datetime.date.today()}"
    prof = dict(hw.entries)
    prof["name"] = "calibrated"
    prof["status"] = f"{stamp}; unmeasured entries are the bundled assumptions"
    # one core keeps READS_IN_FLIGHT reads in flight (op_host/gather_tiling.h kGatherCopyBuffers)
    prof["host_dma_latency_s"] = {"value": one["host"]["us_per_row"] * 1e-6 * READS_IN_FLIGHT,
                                  "source": f"{stamp}: 64 B rows from mapped host memory, one core, "
                                            f"{READS_IN_FLIGHT} reads in flight"}
    prof["link_bytes_per_s"] = {"value": full["host"]["gbps"] * 1e9,
                                "source": f"{stamp}: 64 KB rows from mapped host memory, {cores} cores"}
    prof["hbm_bytes_per_s"] = {"value": full["hbm"]["gbps"] * 1e9,
                               "source": f"{stamp}: 64 KB rows from HBM, {cores} cores (read + write)"}
    prof["mte_bytes_per_cycle"] = {"value": full["hbm"]["gbps"] * 1e9 / cores / (hw["clock_ghz"] * 1e9),
                                   "source": f"{stamp}: HBM sweep per core"}
    micro = microkernel_profile(hw, stamp, lambda values, mode, n: _npu_median_us(values, mode, n, args))
    prof.update(micro["entries"])
    files = {"profile (pass with --hw)": common.write_json(f"{out}/profile.json", prof),
             "sweep JSON": common.write_json(f"{out}/dma_sweep.json", dict(sweep=sweep)),
             "microkernel JSON": common.write_json(f"{out}/microkernels.json",
                                                   dict(modes=micro["modes"], fit=micro["fit"]))}
    print(json.dumps({k: v for k, v in prof.items() if k in ("host_dma_latency_s", "link_bytes_per_s",
                                                              "hbm_bytes_per_s", "scalar_ub_cycles",
                                                              "vec_issue_cycles", "vec_cycles_per_repeat")},
                     indent=1))
    bad = [m for m, v in micro["modes"].items() if not (v["checksum_ok"] and v["counts_linear"])]
    if bad:
        print(f"WARNING: microkernel {', '.join(bad)}: checksum unlike the golden (the NPU computed something "
              f"other than the emulation) or counts not linear in n; do not trust those constants")
    common.report_outputs(files)
    return 0
