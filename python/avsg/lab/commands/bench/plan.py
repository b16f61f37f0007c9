"""``avsg bench plan``: the hash plan against the dual-pointer baseline on the paper's three grids.

Grids (S = buffer slots per request, K = selections per step):
  S = K = N for N in 256..2048;  S = 4096 with K 256..2048;  K = 512 with S 512..8192.
Each point runs twice: on **pre-filled** buffers (filled to capacity first, then steps whose
selections hit ``--hit-rate`` of the time, drawn from the previous step, misses new positions) and
on a **real trace** (the embedded one unless ``--trace``; K of its 2048 selections per step,
chosen by a fixed position hash, after ``--warmup`` steps; how full the buffer got is printed). Both matchers run as AscendC kernels
through the strict CPU emulation on the same selections and state, and must produce identical plans
every step. Each launch's counted work becomes a modelled NPU time with the hardware profile
(``--hw``): *serial-pipe* and *overlapped-pipe* (hardware.launch_estimate); p10 / p50 / p90 over
steps. Fill and warm-up steps run in the fast emulation (uncounted).
"""
from __future__ import annotations

import argparse
from typing import Dict, List, Optional

import numpy as np
import torch

from .... import backend, reference
from ....buffer import SparseKVBuffer
from ....cli_util import UsageError, float_in, int_in, reject_together
from ...costmodel import hardware
from ...traces.lookup import TRACE_HELP
from . import common

MATCHERS = ("hash", "dual_pointer")
GRIDS = {"S=K=N": [(n, n) for n in (256, 512, 1024, 2048)],
         "S=4096, K": [(4096, k) for k in (256, 512, 1024, 2048)],
         "K=512, S": [(s, 512) for s in (512, 1024, 2048, 4096, 8192)]}
QUICK_GRIDS = {"S=K=N": [(256, 256), (2048, 2048)],
               "S=4096, K": [(4096, 256), (4096, 2048)],
               "K=512, S": [(512, 512), (8192, 512)]}
PAPER = {"dual/hash at S=K=2048": 2.80, "hash K 256->2048 (S=4096)": 1.27,
         "hash S 512->8192 (K=512)": 1.60}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_in(1, 40), default=2,
                        help="requests per launch, one per emulated core, 1..40 (default 2)")
    parser.add_argument("--steps", type=int_in(1, 10000), default=6,
                        help="measured steps per point and mode, 1..10000 (default 6)")
    parser.add_argument("--hit-rate", type=float_in(0, 1, high_open=True), default=0.9,
                        help="pre-filled mode: share of each step's selections that hit, in "
                             "[0, 1) (default 0.9)")
    parser.add_argument("--trace", help=f"selection trace: {TRACE_HELP}")
    parser.add_argument("--warmup", type=int_in(0, 100000), default=128,
                        help="trace mode: steps before measuring, fast emulation, 0..100000 "
                             "(default 128)")
    parser.add_argument("--no-trace", action="store_true",
                        help="pre-filled buffers only (not with --trace)")
    parser.add_argument("--quick", action="store_true",
                        help="two points per grid (the ends), for a fast check")
    parser.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0,
                        help="pre-filled mode seed, >= 0 (default 0)")
    parser.add_argument("--policies", action="store_true",
                        help="only compare the residency policies' cost in the kernel: reuse, "
                             "lifetime and lru at T = 1, 2, 4, hash matcher, the trace's first --rows "
                             "layers (one per core), capacity 8192, --steps counted steps after "
                             "--warmup fast ones; bundled and pessimistic (scalar UB and vector "
                             "issue at 3x) profiles; records in DIR/plan_policies.json")
    parser.add_argument("--phases", action="store_true",
                        help="only break the --policies runs down by step of the kernel (phases "
                             "marked in op_kernel/plan_kernel.h): per policy and T a table of each "
                             "phase's serial-pipe us on the launch's slowest core (median over the "
                             "--steps counted steps), its share, the us of each pipe, MTE2 / MTE3 "
                             "KB, scalar accesses, vector instructions and pipe barriers; --hw "
                             "profile; records in DIR/plan_phases.json")
    common.add_common_arguments(parser, "plan")
    common.add_tables_argument(parser, "docs/results/plan.md")


def _fullness(buf: SparseKVBuffer) -> float:
    slot_pos = reference.view_state(buf.state, buf.layout).slot_pos
    return float((slot_pos >= 0).double().mean())


def prefilled_stream(S: int, K: int, rows: int, steps: int, hit_rate: float, seed: int):
    """(fill steps, measured steps, max position): selections int32 [rows, 1, K] per step."""
    rng = np.random.default_rng(seed)
    fill, nxt = [], 0
    while nxt < S:
        n = min(K, S - nxt)
        block = np.arange(nxt, nxt + K) if n == K else np.concatenate(
            [np.arange(nxt, nxt + n), np.arange(nxt - (K - n), nxt)])
        fill.append(np.sort(np.tile(block, (rows, 1)), axis=1))
        nxt += n
    prev = fill[-1]
    measured = []
    hits = int(round(hit_rate * K))
    for _ in range(steps):
        cur = np.empty((rows, K), np.int64)
        for r in range(rows):
            keep = rng.choice(prev[r], size=hits, replace=False)
            new = np.arange(nxt, nxt + K - hits)
            cur[r] = np.sort(np.concatenate([keep, new]))
        nxt += K - hits
        measured.append(cur)
        prev = cur
    as_t = lambda a: torch.from_numpy(a).to(torch.int32).view(rows, 1, K)  # noqa: E731
    return [as_t(a) for a in fill], [as_t(a) for a in measured], nxt


def trace_stream(sel: np.ndarray, K: int, warmup: int, steps: int):
    """K of each step's selections: those whose positions rank lowest under a fixed hash, so a
    position kept one step is kept the next while it stays selected (reuse is preserved)."""
    rows = sel.shape[0]
    prio = (sel.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(1 << 32)
    keep = np.argsort(prio, axis=2, kind="stable")[:, :, :K]
    sub = np.sort(np.take_along_axis(sel, keep, axis=2), axis=2)
    as_t = lambda s: torch.from_numpy(np.ascontiguousarray(sub[:, s])).to(torch.int32).view(rows, 1, K)  # noqa: E731
    return [as_t(s) for s in range(warmup)], [as_t(s) for s in range(warmup, warmup + steps)]


def run_point(S: int, K: int, fill, measured, seq_for, max_context: int, hw) -> Dict:
    rows = fill[0].shape[0] if fill else measured[0].shape[0]
    bufs = {m: SparseKVBuffer(rows=rows, capacity=S, topk=K, check=False, max_context=max_context,
                          track_copies=False)   # plans only: no KV to copy
            for m in MATCHERS}
    with backend.emulation("fast"):
        for i, topk in enumerate(fill):
            for m, buf in bufs.items():
                buf.plan(topk, seq_for("fill", i), matcher=m)
    fullness = _fullness(bufs["hash"])
    samples: Dict[str, Dict[str, List[float]]] = {m: {"serial_pipe_us": [], "overlapped_pipe_us": [],
                                                      "misses": []} for m in MATCHERS}
    with backend.emulation("strict"):
        for i, topk in enumerate(measured):
            plans = {}
            for m, buf in bufs.items():
                plans[m] = buf.plan(topk, seq_for("measured", i), matcher=m)
                est = hardware.launch_estimate(backend.last_launch_counters(), hw)
                samples[m]["serial_pipe_us"].append(est["serial_pipe_us"])
                samples[m]["overlapped_pipe_us"].append(est["overlapped_pipe_us"])
                samples[m]["misses"].append(int(plans[m].miss_counts.sum()))
            for a, b in zip(plans["hash"][:4], plans["dual_pointer"][:4]):
                if not torch.equal(a, b):
                    raise RuntimeError(f"dual-pointer plan differs from the hash plan at S={S} K={K}")
    out = dict(S=S, K=K, rows=rows, max_context=max_context, fullness_before=fullness, fullness_after=_fullness(bufs["hash"]),
               hit_rate=1 - float(np.mean(samples["hash"]["misses"])) / (rows * K))
    for m in MATCHERS:
        for key in ("serial_pipe_us", "overlapped_pipe_us"):
            v = samples[m][key]
            out[f"{m}_{key}"] = {"p10": float(np.percentile(v, 10)), "p50": float(np.percentile(v, 50)),
                                 "p90": float(np.percentile(v, 90)), "samples": v}
    out["ratio_p50_serial"] = out["dual_pointer_serial_pipe_us"]["p50"] / out["hash_serial_pipe_us"]["p50"]
    out["ratio_p50_overlapped"] = (out["dual_pointer_overlapped_pipe_us"]["p50"]
                                   / out["hash_overlapped_pipe_us"]["p50"])
    return out


def npu_plan_times(S: int, K: int, fill, measured, seq_for, max_context: int) -> Dict[str, List[float]]:
    """--device npu: the same steps on NPU buffers, each measured step timed with torch.npu.Event
    (the fill steps are the warm-up). Unverified: never run, no NPU was available."""
    rows = measured[0].shape[0]
    times: Dict[str, List[float]] = {}
    for m in MATCHERS:
        buf = SparseKVBuffer(rows=rows, capacity=S, topk=K, check=False, max_context=max_context,
                             device="npu", track_copies=False)
        for i, topk in enumerate(fill):
            buf.plan(topk.npu(), seq_for("fill", i).npu(), matcher=m)
        times[m] = []
        for i, topk in enumerate(measured):
            t, q = topk.npu(), seq_for("measured", i).npu()
            start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
            start.record()
            buf.plan(t, q, matcher=m)
            end.record()
            end.synchronize()
            times[m].append(1e3 * start.elapsed_time(end))
    return times


POLICY_T = (1, 2, 4)
POLICY_CAPACITY = 8192
POLICY_NAMES = ("reuse", "lifetime", "lru")


def pessimistic_profile(hw):
    """The bundled constants with scalar UB access and vector issue each at 3x: a gain that only
    exists under one set of constants shows up as a gap between the two."""
    import copy
    worse = copy.deepcopy(hw)
    for key in ("scalar_ub_cycles", "vec_issue_cycles"):
        worse.override(key, 3 * hw[key], f"3x the {hw.name} value (pessimistic)")
    return worse


def state_bytes_per_row(buf: SparseKVBuffer) -> int:
    return int(buf.state.shape[1]) * buf.state.element_size()


def policy_launches(sel: np.ndarray, positions, warmup: int, steps: int, T: int, name: str,
                    read=None):
    """One policy (hash matcher) at T query tokens on the trace's first rows, one row per core,
    capacity 8192: ``warmup`` steps in the fast emulation, then ``steps`` counted steps. The T
    query tokens of step s are trace steps s .. s + T - 1 (teacher-forced drafts, sliding by
    one step). Returns the buffer and per counted step (its rows' miss counts, ``read()`` after
    it: default ``backend.last_launch_counters``)."""
    read = read or backend.last_launch_counters
    rows, _, k = sel.shape
    buf = SparseKVBuffer(rows=rows, capacity=POLICY_CAPACITY, topk=k, queries_per_step=T,
                         check=False, policy=name, track_copies=False)

    def step_args(s):
        topk = np.ascontiguousarray(sel[:, s:s + T])
        seq = torch.full((rows,), int(positions[s + T - 1]) + 1, dtype=torch.int32)
        return torch.from_numpy(topk).to(torch.int32).view(rows, T, k), seq
    with backend.emulation("fast"):
        for s in range(warmup):
            buf.plan(*step_args(s))
    counted = []
    with backend.emulation("strict"):
        for s in range(warmup, warmup + steps):
            plan = buf.plan(*step_args(s))
            counted.append((plan.miss_counts.tolist(), read()))
    return buf, counted


def policy_comparison(sel: np.ndarray, positions, warmup: int, steps: int, hw) -> List[Dict]:
    """Each policy (hash matcher) at T = 1, 2, 4 as :func:`policy_launches` runs it. One record
    per policy and T under each profile (bundled, pessimistic)."""
    rows, _, k = sel.shape
    profiles = {"bundled": hw, "pessimistic": pessimistic_profile(hw)}
    records = []
    for T in POLICY_T:
        for name in POLICY_NAMES:
            buf, counted = policy_launches(sel, positions, warmup, steps, T, name)
            per_profile = {p: {"serial": [], "overlapped": []} for p in profiles}
            misses = []
            for step_misses, counters in counted:
                misses.extend(step_misses)
                for p, prof in profiles.items():
                    est = hardware.launch_estimate(counters, prof)
                    per_profile[p]["serial"].extend(est["serial_per_block_us"])
                    per_profile[p]["overlapped"].extend(est["overlapped_per_block_us"])
            for p, d in per_profile.items():
                records.append(dict(policy=name, T=T, profile=p,
                                    serial_pipe_us_p50=float(np.median(d["serial"])),
                                    overlapped_pipe_us_p50=float(np.median(d["overlapped"])),
                                    misses_per_row=float(np.mean(misses)),
                                    state_bytes_per_row=state_bytes_per_row(buf),
                                    rows=rows, capacity=POLICY_CAPACITY, K=k, warmup=warmup,
                                    steps=steps))
    return records


def anchors(points: List[Dict]) -> Dict[str, Optional[float]]:
    by = {(p["grid"], p["S"], p["K"]): p for p in points}
    h = lambda g, s, k: by.get((g, s, k), {}).get("hash_serial_pipe_us", {}).get("p50")  # noqa: E731
    r = by.get(("S=K=N", 2048, 2048), {}).get("ratio_p50_serial")
    k_grow = (h("S=4096, K", 4096, 2048) / h("S=4096, K", 4096, 256)
              if h("S=4096, K", 4096, 2048) and h("S=4096, K", 4096, 256) else None)
    s_grow = (h("K=512, S", 8192, 512) / h("K=512, S", 512, 512)
              if h("K=512, S", 8192, 512) and h("K=512, S", 512, 512) else None)
    return {"dual/hash at S=K=2048": r, "hash K 256->2048 (S=4096)": k_grow,
            "hash S 512->8192 (K=512)": s_grow}


def plot(points: List[Dict], path: str) -> None:
    plt = common.pyplot()
    from matplotlib import ticker
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    xs = {"S=K=N": ("K", "N (= S = K)"), "S=4096, K": ("K", "K (S = 4096)"),
          "K=512, S": ("S", "S (K = 512)")}
    for ax, (grid, (axis, label)) in zip(axes, xs.items()):
        for mode, marker in (("pre-filled", "o"), ("trace", "s")):
            for m, color in (("hash", "tab:blue"), ("dual_pointer", "tab:red")):
                pts = sorted((p[axis], p[f"{m}_serial_pipe_us"]) for p in points
                             if p["grid"] == grid and p["mode"] == mode)
                if not pts:
                    continue
                x = [a for a, _ in pts]
                y = [b["p50"] for _, b in pts]
                err = [[b["p50"] - b["p10"] for _, b in pts], [b["p90"] - b["p50"] for _, b in pts]]
                ax.errorbar(x, y, yerr=err, marker=marker, color=color, capsize=3,
                            linestyle="-" if mode == "pre-filled" else "--",
                            label=f"{'hash' if m == 'hash' else 'dual-pointer'}, {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("modelled us per launch (serial-pipe p50, bars p10-p90)")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if str(int(v))[0] in "25" else ""))
        ax.set_title(f"latency vs {axis}: {grid}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("avsg bench plan: modelled 910B plan time from the CPU emulation's counted work "
                 "(assumed profile), not measured", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    reject_together(args, "--no-trace", "--trace", "--no-trace measures pre-filled buffers only, "
                    "--trace names the trace to measure; give one")
    if args.phases:
        reject_together(args, "--phases", "--policies", "--phases breaks the --policies runs "
                        "down by phase; give one")
        if args.no_trace:
            raise UsageError("--phases: needs the trace (pass --trace; not with --no-trace)")
        if args.quick:
            raise UsageError("--quick: picks grid points, --phases measures none; not with --phases")
        if args.device != "cpu":
            raise UsageError("--phases: the breakdown is the CPU emulation's counted work; not "
                             "with --device npu")
    common.at_least("--rows", args.rows)
    common.at_least("--steps", args.steps)
    common.at_least("--warmup", args.warmup, 0)
    if not 0.0 <= args.hit_rate < 1.0:
        raise UsageError(f"--hit-rate: expected a share in [0, 1), got {args.hit_rate}")
    if args.rows > 40:
        raise UsageError(f"--rows: expected at most 40 (one per AIV core), got {args.rows}")
    hw = common.load_hw(args)
    if args.device == "npu":
        common.require_npu("plan")
    out = common.out_dir(args, "plan")
    trace = None if args.no_trace else common.trace_path(args.trace)
    if args.policies and trace is None:
        raise UsageError("--policies: needs the trace (pass --trace; not with --no-trace)")
    sel = None
    if trace is not None:
        from ...traces.lookup import load_selections
        extra = max(POLICY_T) - 1 if args.policies or args.phases else 0
        tsel, positions, context = load_selections(
            trace, args.rows, args.warmup + args.steps + extra, layers_option="--rows",
            steps_option="--warmup + --steps" + (f" + {extra}" if extra else ""))
        if tsel.shape[2] < 2048:
            raise UsageError(f"--trace: expected top-2048 selections, the trace has top-{tsel.shape[2]}")
        sel = tsel
    grids = QUICK_GRIDS if args.quick else GRIDS
    print(f"avsg bench plan: hash vs dual-pointer (matcher='dual_pointer'), {args.rows} rows = "
          f"{args.rows} emulated cores, {args.steps} measured steps per point; hardware '{hw.name}'; "
          f"{common.machine()}")
    print("  MODEL ESTIMATE from the CPU emulation's counted work, not a measurement: " + hw.status)
    # One emulated core per row: each matcher's per-row cost, as the paper compares them (with
    # idle cores and AVSG_NPU_SPLIT=1 the hash plan would also spread a row's lookup over them;
    # the dual pointer cannot). Restored before returning.
    saved_cores = backend.emulated_cores()
    backend.set_emulated_cores(args.rows)
    try:
        if args.policies:
            return _run_policies(args, hw, trace, sel, positions, out)
        if args.phases:
            return _run_phases(args, hw, trace, sel, positions, out)
        return _run(args, hw, trace, sel, positions if sel is not None else None,
                    context if sel is not None else None, out, grids)
    finally:
        backend.set_emulated_cores(saved_cores)


def _run_policies(args, hw, trace, sel, positions, out) -> int:
    records = policy_comparison(sel, positions, args.warmup, args.steps, hw)
    print(f"\n  policy cost in the kernel (MODEL ESTIMATE): {trace}, {args.warmup} warm-up steps, "
          f"{args.steps} counted, K {sel.shape[2]}, S {POLICY_CAPACITY}, {sel.shape[0]} rows, one per "
          f"core; p50 per row-step")
    print(f"  {'policy':<9} {'T':>2} | {'serial us':>9} {'ovl us':>7} | {'pess. serial':>12} "
          f"{'pess. ovl':>9} | {'misses/row':>10} {'state B/row':>11}")
    by = {(r["policy"], r["T"], r["profile"]): r for r in records}
    for T in POLICY_T:
        for name in POLICY_NAMES:
            b, w = by[(name, T, "bundled")], by[(name, T, "pessimistic")]
            print(f"  {name:<9} {T:>2} | {b['serial_pipe_us_p50']:>9.1f} {b['overlapped_pipe_us_p50']:>7.1f} | "
                  f"{w['serial_pipe_us_p50']:>12.1f} {w['overlapped_pipe_us_p50']:>9.1f} | "
                  f"{b['misses_per_row']:>10.1f} {b['state_bytes_per_row']:>11,d}")
    return _write_records(out, "policies", hw, trace, records)


def _write_records(out, mode: str, hw, trace, records) -> int:
    """What --policies and --phases end with: the model's caveat, then DIR/plan_MODE.json."""
    print("  " + hardware.PLAN_LEAVES_OUT)
    path = common.write_json(f"{out}/plan_{mode}.json", dict(
        command=f"avsg bench plan --{mode}", estimate=True, machine=common.machine(),
        hardware_name=hw.name, hardware=hw.sources(), trace=trace, records=records,
        leaves_out=hardware.PLAN_LEAVES_OUT))
    common.report_outputs({"JSON": path})
    return 0


def phase_table(breakdown: Dict) -> List[str]:
    """The lines of one policy and T's phase breakdown (plan_cost.phase_breakdown)."""
    lines = [f"  {'phase':<16} {'us':>7} {'share':>6} | {'scalar':>7} {'vector':>7} {'MTE2':>7} "
             f"{'MTE3':>7} {'sync':>7} | {'MTE2 KB':>8} {'MTE3 KB':>8} {'scalar':>7} "
             f"{'vector':>6} {'barriers':>8}",
             f"  {'':<16} {'':>7} {'':>6} | {'us per pipe':^39} | {'':>8} {'':>8} "
             f"{'ops':>7} {'instr':>6} {'':>8}"]
    for r in (*breakdown["phases"], breakdown["total"]):
        lines.append(f"  {r['phase']:<16} {r['serial_us']:>7.1f} {r['share']:>6.1%} | "
                     f"{r['scalar_us']:>7.1f} {r['vector_us']:>7.1f} {r['mte2_us']:>7.1f} "
                     f"{r['mte3_us']:>7.1f} {r['sync_us']:>7.1f} | {r['mte2_bytes'] / 1024:>8.1f} "
                     f"{r['mte3_bytes'] / 1024:>8.1f} {r['scalar_ops']:>7.0f} {r['vec_instrs']:>6.0f} "
                     f"{r['pipe_barriers']:>8.0f}")
    return lines


def _run_phases(args, hw, trace, sel, positions, out) -> int:
    from ...costmodel.plan_cost import phase_breakdown
    rows, _, k = sel.shape
    print(f"\n  plan row-step by phase (MODEL ESTIMATE): {trace}, {args.warmup} warm-up steps, "
          f"{args.steps} counted, K {k}, S {POLICY_CAPACITY}, {rows} rows, one per core; per "
          f"phase the median over counted steps of the slowest core's serial-pipe us; share: of "
          f"the phases' sum (medians need not add up to the total's)")
    records = []
    for T in POLICY_T:
        for name in POLICY_NAMES:
            _, counted = policy_launches(sel, positions, args.warmup, args.steps, T, name,
                                         read=backend.last_launch_phases)
            misses = [m for step_misses, _ in counted for m in step_misses]
            breakdown = phase_breakdown([phases for _, phases in counted], hw)
            print(f"\n  {name}, T={T}: total {breakdown['total']['serial_us']:.1f} us serial-pipe, "
                  f"{float(np.mean(misses)):.1f} misses per row")
            for line in phase_table(breakdown):
                print(line)
            records.append(dict(policy=name, T=T, rows=rows, capacity=POLICY_CAPACITY, K=k,
                                warmup=args.warmup, steps=args.steps,
                                misses_per_row=float(np.mean(misses)), **breakdown))
    return _write_records(out, "phases", hw, trace, records)


def _run(args, hw, trace, sel, positions, context, out, grids) -> int:
    from ...traces.lookup import trace_label
    modes = ["pre-filled"] + (["trace"] if sel is not None else [])
    todo = [(g, s, k, mode) for g, pts in grids.items() for s, k in pts for mode in modes]
    progress = common.bar(len(todo), "plan", args)
    points = []
    try:
        for grid, S, K, mode in todo:
            if mode == "pre-filled":
                fill, measured, top = prefilled_stream(S, K, args.rows, args.steps, args.hit_rate,
                                                       args.seed)
                seq = torch.full((args.rows,), top + 1, dtype=torch.int32)
                p = run_point(S, K, fill, measured, lambda *_: seq, top + 1, hw)
            else:
                fill, measured = trace_stream(sel, K, args.warmup, args.steps)

                def seq_fn(phase, i):
                    step = i + (args.warmup if phase == "measured" else 0)
                    return torch.full((args.rows,), int(positions[step]) + 1, dtype=torch.int32)
                p = run_point(S, K, fill, measured, seq_fn, context, hw)
            if args.device == "npu":
                measured_us = npu_plan_times(S, K, fill, measured, (lambda *_: seq) if mode ==
                                             "pre-filled" else seq_fn, p["max_context"])
                p["npu_measured_us"] = {m: {"p50": float(np.percentile(v, 50)), "samples": v}
                                        for m, v in measured_us.items()}
            points.append(dict(p, grid=grid, mode=mode))
            progress.update()
    finally:
        progress.close()
    for mode in modes:
        src = (f"trace {trace_label(trace)}, {args.warmup} warm-up steps" if mode == "trace" else
               f"buffers filled to capacity, then {100 * args.hit_rate:.0f}% hits per step")
        print(f"\n  {mode}: {src}; modelled us per launch (serial-pipe p10 / p50 / p90; "
              f"overlapped-pipe p50)")
        print(f"  {'grid':<11} {'S':>5} {'K':>5} {'full':>5} {'hits':>5} | "
              f"{'hash p10':>8} {'p50':>7} {'p90':>7} {'ovl p50':>7} | {'dual p10':>8} {'p50':>8} "
              f"{'p90':>8} {'ovl p50':>8} | {'dual/hash':>9}")
        for p in (x for x in points if x["mode"] == mode):
            h, d = p["hash_serial_pipe_us"], p["dual_pointer_serial_pipe_us"]
            print(f"  {p['grid']:<11} {p['S']:>5} {p['K']:>5} {p['fullness_before']:>5.0%} "
                  f"{p['hit_rate']:>5.0%} | {h['p10']:>8.1f} {h['p50']:>7.1f} {h['p90']:>7.1f} "
                  f"{p['hash_overlapped_pipe_us']['p50']:>7.1f} | {d['p10']:>8.1f} {d['p50']:>8.1f} "
                  f"{d['p90']:>8.1f} {p['dual_pointer_overlapped_pipe_us']['p50']:>8.1f} | "
                  f"{p['ratio_p50_serial']:>8.2f}x")
    summary = {}
    print("\n  paper anchors (p50, serial-pipe)      paper   " + "   ".join(f"{m:>10}" for m in modes))
    for mode in modes:
        summary[mode] = anchors([p for p in points if p["mode"] == mode])
    for key, paper in PAPER.items():
        ours = "   ".join(f"{summary[m][key]:>9.2f}x" if summary[m][key] else f"{'-':>10}" for m in modes)
        print(f"  {key:<36} {paper:>5.2f}x   {ours}")
    print("  dual-pointer = whatever op_kernel/plan_kernel.h's plan_dual_pointer is in this build")
    print("  " + hardware.PLAN_LEAVES_OUT)
    files = {"JSON": common.write_json(f"{out}/plan.json", dict(
        command="avsg bench plan", estimate=True, machine=common.machine(), hardware_name=hw.name,
        hardware=hw.sources(), trace=trace, rows=args.rows, steps=args.steps,
        hit_rate=args.hit_rate, warmup=args.warmup, points=points, anchors=summary, paper=PAPER,
        leaves_out=hardware.PLAN_LEAVES_OUT))}
    files["plot"] = common.save_plot(f"{out}/plan_latency.png", lambda p: plot(points, p))
    blocks = []
    for mode in modes:
        rows = []
        for p in (x for x in points if x["mode"] == mode):
            h, d = p["hash_serial_pipe_us"], p["dual_pointer_serial_pipe_us"]
            rows.append([p["grid"], str(p["S"]), str(p["K"]), f"{p['fullness_before']:.0%}",
                         f"{p['hit_rate']:.0%}", f"{h['p10']:.1f} / {h['p50']:.1f} / {h['p90']:.1f}",
                         f"{d['p10']:.1f} / {d['p50']:.1f} / {d['p90']:.1f}",
                         f"{p['ratio_p50_serial']:.2f}x"])
        blocks.append(common.markdown_table(
            f"plan-{'prefilled' if mode == 'pre-filled' else 'trace'}",
            ["grid", "S", "K", "buffer full", "hits", "hash est. us p10 / p50 / p90",
             "dual-pointer est. us p10 / p50 / p90", "dual / hash (p50)"], rows, "lrrrrrrr"))
    blocks.append(common.markdown_table(
        "plan-anchors", ["anchor (p50, serial-pipe)", "paper", *modes],
        [[k, f"{v:.2f}x", *[f"{summary[m][k]:.2f}x" if summary[m][k] else "-" for m in modes]]
         for k, v in PAPER.items()]))
    tables = common.write_tables(args.tables, common.invocation(args), blocks)
    if tables:
        files["tables"] = tables
    common.report_outputs(files)
    return 0
