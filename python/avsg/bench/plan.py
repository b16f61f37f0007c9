"""plan (vectorised hash matcher) against the scalar dual-pointer baseline, on a real trace; and
the default residency policy (reuse) against the paper's lifetime policy (same matcher).

Both run as AscendC kernels through the CPU emulation, on the same selections and the same state
(the dual-pointer plan gives identical results, checked every step). NPU time is *estimated* from
the work each launch issued (vector repeats, scalar accesses, DMA bytes and issues, syncs) with the
emulation's cost model (op_kernel/cpu/emu_core.h: every constant an assumption); CPU wall time of
the emulation is printed too but says nothing about an NPU.

    python -m avsg.bench.plan [--trace T] [--layers 24] [--steps 24] [--capacity 8192]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ..buffer import SparseKVBuffer
from ..demo import find_trace, load_selections
from .common import counted_launch, machine, write_json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace")
    parser.add_argument("--layers", type=int, default=24, help="trace layers = buffer rows")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--capacity", type=int, default=8192)
    parser.add_argument("--json", default="results/bench_plan.json")
    args = parser.parse_args(argv)
    trace = find_trace(args.trace)
    if trace is None:
        raise SystemExit("no trace: pass --trace (the shared one is ../shared/traces/asyncio_32k.npz)")
    sel, positions, context = load_selections(trace, args.layers, args.steps)
    layers, steps, k = sel.shape
    bufs = {m: SparseKVBuffer(rows=layers, capacity=args.capacity, topk=k, check=False,
                              max_context=context)
            for m in ("hash", "dual_pointer")}
    lifetime_buf = SparseKVBuffer(rows=layers, capacity=args.capacity, topk=k, check=False,
                                  policy="lifetime")
    rows = []
    for step in range(steps):
        topk = torch.from_numpy(sel[:, step]).to(torch.int32).view(layers, 1, k)
        seq = torch.full((layers,), int(positions[step]) + 1, dtype=torch.int32)
        out = {}
        for matcher, buf in bufs.items():
            started = time.perf_counter()
            plan = buf.plan(topk, seq, matcher=matcher)
            out[matcher] = dict(counted_launch(), cpu_ms=1e3 * (time.perf_counter() - started),
                                misses=int(plan.miss_counts.sum()), plan=plan)
        started = time.perf_counter()
        plan = lifetime_buf.plan(topk, seq)
        out["lifetime"] = dict(counted_launch(), cpu_ms=1e3 * (time.perf_counter() - started),
                               misses=int(plan.miss_counts.sum()))
        for a, b in zip(out["hash"].pop("plan")[:4], out["dual_pointer"].pop("plan")[:4]):
            assert torch.equal(a, b), "dual-pointer plan differs from the hash plan"
        if step:  # step 0 fills an empty buffer: not a steady-state step
            rows.append(dict(step=step, **{f"{m}_{key}": v for m, d in out.items()
                                           for key, v in d.items()}))
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    print(f"plan vs dual-pointer: {trace}, {layers} rows x top-{k}, capacity {args.capacity}, "
          f"{len(rows)} steady steps, {rows[0]['hash_blocks']} cores; {machine()}")
    print(f"{'per step (median)':<26} {'hash':>12} {'dual-pointer':>14} {'ratio':>7}")
    for key, label in (("serial_us", "est. NPU us (upper)"), ("overlap_us", "est. NPU us (lower)"),
                       ("vec_repeats", "vector repeats"), ("scalar_ops", "scalar accesses"),
                       ("mte2_bytes", "GM->UB bytes"), ("cpu_ms", "CPU ms (emulation)")):
        h, d = med(f"hash_{key}"), med(f"dual_pointer_{key}")
        print(f"{label:<26} {h:>12,.1f} {d:>14,.1f} {d / h if h else float('nan'):>6.2f}x")
    print()
    print("policy: reuse (default) vs lifetime 16, hash matcher, same steps")
    print(f"{'per step (median)':<26} {'reuse':>12} {'lifetime':>14} {'ratio':>7}")
    for key, label in (("serial_us", "est. NPU us (upper)"), ("overlap_us", "est. NPU us (lower)"),
                       ("vec_repeats", "vector repeats"), ("scalar_ops", "scalar accesses"),
                       ("mte2_bytes", "GM->UB bytes"), ("misses", "misses (all rows)"),
                       ("cpu_ms", "CPU ms (emulation)")):
        h, d = med(f"hash_{key}"), med(f"lifetime_{key}")
        print(f"{label:<26} {h:>12,.1f} {d:>14,.1f} {h / d if d else float('nan'):>6.2f}x")
    write_json(args.json, dict(trace=trace, layers=layers, topk=k, capacity=args.capacity,
                               machine=machine(), steps=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
