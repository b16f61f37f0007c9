"""Gather partitions: miss (S3, balanced chunks) against request (S1) and topk (S2).

A batch of requests decodes over a real trace (one request per trace layer, so miss counts are
skewed the way real requests are); each step's plan is gathered three times, once per partition,
into separate buffers that must end up identical. Per partition it reports the per-core load
balance (the busiest core's copies over the mean) and the estimated NPU time of the launch, which
is the slowest core's (emulation cost model; mapped host memory is not modelled slower than HBM).
For the miss partition it also reports what matters for host reads across PCIe, where each DMA
pays microseconds of latency: DMAs issued (the busiest core's reads and writes) and the most reads
and host rows one core keeps in flight, with and without page reads (AVSG_GATHER_PAGE_READS=1:
one read may also fetch the unmissed rows between two misses of one host page).

    python -m avsg.bench.gather [--trace T] [--requests 8] [--steps 16] [--cores 40]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics

import torch

from .. import reference
from ..buffer import SparseKVBuffer, gather
from ..demo import ROW_BYTES, find_trace, load_selections
from .. import backend
from .common import counted_launch, machine, write_json

PAGE_READS_ENV = "AVSG_GATHER_PAGE_READS"


@contextlib.contextmanager
def page_reads(on: bool):
    previous = os.environ.get(PAGE_READS_ENV)
    os.environ[PAGE_READS_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(PAGE_READS_ENV, None)
        else:
            os.environ[PAGE_READS_ENV] = previous


def dma_profile(row_bytes: int) -> dict:
    """DMAs and reads in flight of the last launch, from the emulation's counters."""
    c = backend.last_launch_counters()
    reads, writes = c["mte2_copies"], c["mte3_copies"]
    busiest = int((reads + writes).argmax())
    return dict(reads=int(reads.sum()), writes=int(writes.sum()),
                busiest_reads=int(reads[busiest]), busiest_writes=int(writes[busiest]),
                reads_in_flight=int(c["mte2_inflight_max"].max()),
                rows_in_flight=int(c["mte2_inflight_bytes_max"].max()) // row_bytes,
                host_bytes=int(c["mte2_bytes"].sum()))


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
    paged_dst = torch.zeros(R, args.capacity, ROW_BYTES, dtype=torch.uint8)
    buf = SparseKVBuffer(rows=R, capacity=args.capacity, topk=k, max_context=context)
    rows = []
    for step in range(steps):
        topk = torch.from_numpy(sel[:, step]).to(torch.int32).view(R, 1, k)
        seq = torch.full((R,), int(positions[step]) + 1, dtype=torch.int32)
        plan = buf.plan(topk, seq)
        row = dict(step=step, misses=int(plan.miss_counts.sum()))
        for partition, dst in dsts.items():
            with page_reads(False):
                per_core = gather(plan, host, dst, partition=partition, num_cores=args.cores)
            load = per_core.double()
            row[partition] = dict(counted_launch(), max_copies=int(load.max()),
                                  imbalance=float(load.max() / load.mean()) if load.sum() else 1.0)
            if partition == "miss":
                row["dma"] = dma_profile(ROW_BYTES)
                with page_reads(True):
                    gather(plan, host, paged_dst, partition=partition, num_cores=args.cores)
                row["dma_page_reads"] = dict(dma_profile(ROW_BYTES), **counted_launch())
        assert all(torch.equal(dsts["miss"], d) for d in dsts.values()), "partitions disagree"
        assert torch.equal(dsts["miss"], paged_dst), "page reads changed the bytes"
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
    print("\nmiss partition, DMAs per launch (reads GM->UB incl. index loads, writes UB->GM), "
          "median over steps:")
    print(f"{'host reads':<22} {'reads':>7} {'writes':>7} {'busiest core r+w':>17} "
          f"{'reads in flight':>16} {'rows in flight':>15} {'host MB':>8} {'est. us (upper)':>16}")
    for key, label, time_key in (("dma", "exact runs (default)", "miss"),
                                 ("dma_page_reads", "page reads", "dma_page_reads")):
        med = lambda k: statistics.median(r[key][k] for r in rows)  # noqa: E731
        us = statistics.median(r[time_key]["serial_us"] for r in rows)
        print(f"{label:<22} {med('reads'):>7,.0f} {med('writes'):>7,.0f} "
              f"{med('busiest_reads') + med('busiest_writes'):>17,.0f} {med('reads_in_flight'):>16,.0f} "
              f"{med('rows_in_flight'):>15,.0f} {med('host_bytes') / 1e6:>8.2f} {us:>16,.1f}")
    write_json(args.json, dict(trace=trace, requests=R, topk=k, capacity=args.capacity,
                               cores=args.cores, row_bytes=ROW_BYTES, machine=machine(),
                               steps=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
