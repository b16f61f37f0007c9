"""Gather partitions: miss (S3, balanced chunks) against request (S1) and topk (S2).

A batch of requests decodes over a real trace (one request per trace layer, so miss counts are
skewed the way real requests are); each step's plan is gathered three times, once per partition,
into separate buffers that must end up identical. Per partition it reports the per-core load
balance (the busiest core's copies over the mean) and the estimated NPU time of the launch, which
is the slowest core's (emulation cost model; mapped host memory is not modelled slower than HBM).

    python -m avsg.bench.gather [--trace T] [--requests 8] [--steps 16] [--cores 40]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from .. import reference
from ..buffer import SparseKVBuffer, gather
from ..demo import ROW_BYTES, find_trace, load_selections
from .common import counted_launch, machine, write_json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace")
    parser.add_argument("--requests", type=int, default=8, help="rows (trace layers 0..R-1)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--capacity", type=int, default=8192)
    parser.add_argument("--cores", type=int, default=40)
    parser.add_argument("--json", default="results/bench_gather.json")
    args = parser.parse_args(argv)
    trace = find_trace(args.trace)
    if trace is None:
        raise SystemExit("no trace: pass --trace (the shared one is ../shared/traces/asyncio_32k.npz)")
    sel, positions, context = load_selections(trace, args.requests, args.steps)
    R, steps, k = sel.shape
    host = torch.randint(0, 256, (R, context, ROW_BYTES), dtype=torch.uint8)
    dsts = {p: torch.zeros(R, args.capacity, ROW_BYTES, dtype=torch.uint8)
            for p in reference.PARTITIONS}
    buf = SparseKVBuffer(rows=R, capacity=args.capacity, topk=k, max_context=context)
    rows = []
    for step in range(steps):
        topk = torch.from_numpy(sel[:, step]).to(torch.int32).view(R, 1, k)
        seq = torch.full((R,), int(positions[step]) + 1, dtype=torch.int32)
        plan = buf.plan(topk, seq)
        row = dict(step=step, misses=int(plan.miss_counts.sum()))
        for partition, dst in dsts.items():
            per_core = gather(plan, host, dst, partition=partition, num_cores=args.cores)
            load = per_core.double()
            row[partition] = dict(counted_launch(), max_copies=int(load.max()),
                                  imbalance=float(load.max() / load.mean()) if load.sum() else 1.0)
        assert all(torch.equal(dsts["miss"], d) for d in dsts.values()), "partitions disagree"
        if step:  # step 0 copies whole selections into empty buffers
            rows.append(row)
    print(f"gather partitions: {trace}, {R} requests x top-{k}, capacity {args.capacity}, "
          f"{args.cores} cores, {ROW_BYTES}-byte rows, {len(rows)} steps after warm-up "
          f"(median {statistics.median(r['misses'] for r in rows):,.0f} misses/step); {machine()}")
    print(f"{'partition':<10} {'busiest core':>12} {'max/mean':>9} {'est. us (upper)':>16} "
          f"{'est. us (lower)':>16} {'vs miss':>8}")
    base = statistics.median(r["miss"]["serial_us"] for r in rows)
    for partition in reference.PARTITIONS:
        med = lambda key: statistics.median(r[partition][key] for r in rows)  # noqa: E731
        print(f"{partition:<10} {med('max_copies'):>12,.0f} {med('imbalance'):>9.2f} "
              f"{med('serial_us'):>16,.1f} {med('overlap_us'):>16,.1f} "
              f"{med('serial_us') / base:>7.2f}x")
    write_json(args.json, dict(trace=trace, requests=R, topk=k, capacity=args.capacity,
                               cores=args.cores, row_bytes=ROW_BYTES, machine=machine(),
                               steps=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
