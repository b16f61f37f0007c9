"""CPU time per call of plan and gather in the strict and the fast emulation build.

Both builds run the same AscendC kernel sources (avsg.backend.set_emulation): strict checks every
rule of the emulation and counts the work, fast compiles that out. This times one decode step's
ops on the CPU backend, the same steps in both builds from the same start, and checks that the
outputs, the state and the buffer are identical. The numbers are this machine's CPU, not NPU time
(for that, see the counted-work estimates of avsg.bench.plan / avsg.bench.gather).

Workload: R requests x T query tokens x top-K selections over a context, drawn from slowly
drifting per-request scores (consecutive steps share most of their selections, as decode steps
do); a contiguous host pool of ``--row-bytes`` rows; gather with the default miss partition.

    python -m avsg.bench.emulation [--rows 4] [--queries 2] [--topk 2048] [--capacity 8192]
                                   [--context 16384] [--row-bytes 1152] [--steps 12] [--json PATH]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Dict, List

import torch

from .. import backend
from ..buffer import SparseKVBuffer, gather
from .common import machine, write_json


def selections(R: int, T: int, K: int, context: int, steps: int, seed: int = 0) -> List[torch.Tensor]:
    """int32 [R, T, K] per step: top-K of per-request scores that drift a little every step."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(R, context, generator=gen)
    out = []
    for _ in range(steps):
        scores = 0.98 * scores + 0.2 * torch.randn(R, context, generator=gen)  # stationary drift
        per_query = scores.unsqueeze(1) + 0.1 * torch.randn(R, T, context, generator=gen)
        out.append(per_query.topk(K, dim=-1).indices.to(torch.int32).contiguous())
    return out


def run(build: str, args, steps: List[torch.Tensor], host: torch.Tensor) -> Dict[str, object]:
    R = args.rows
    buf = SparseKVBuffer(rows=R, capacity=args.capacity, topk=args.topk, queries_per_step=args.queries,
                         device="cpu", check=False, max_context=args.context)
    dst = torch.zeros(R, args.capacity, args.row_bytes, dtype=torch.uint8)
    seq = torch.full((R,), args.context, dtype=torch.int32)
    times = {"plan": [], "gather": []}
    outputs = []
    with backend.emulation(build):
        for i, topk in enumerate(steps):
            w0, c0 = time.perf_counter(), time.process_time()
            plan = buf.plan(topk, seq)
            w1, c1 = time.perf_counter(), time.process_time()
            gather(plan, host, dst)
            w2, c2 = time.perf_counter(), time.process_time()
            outputs.append((plan.slots, plan.miss_pos, plan.miss_slots, plan.miss_counts))
            if i >= args.warmup:
                times["plan"].append((w1 - w0, c1 - c0))
                times["gather"].append((w2 - w1, c2 - c1))
    return dict(times=times, outputs=outputs, state=buf.state.clone(), dst=dst,
                misses=[int(o[3].sum()) for o in outputs[args.warmup:]])


def median_ms(samples, which: int) -> float:
    return 1000.0 * statistics.median(s[which] for s in samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--queries", type=int, default=2, help="T: query tokens per step (MTP)")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--capacity", type=int, default=8192)
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--row-bytes", type=int, default=1152, help="bytes per KV row (1152: bf16 MLA)")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per build (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps (cold buffer)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)

    steps = selections(args.rows, args.queries, args.topk, args.context, args.warmup + args.steps)
    host = torch.randint(0, 256, (args.rows, args.context, args.row_bytes), dtype=torch.uint8)
    results = {b: run(b, args, steps, host) for b in ("strict", "fast")}

    s, f = results["strict"], results["fast"]
    identical = (all(torch.equal(a, b) for x, y in zip(s["outputs"], f["outputs"]) for a, b in zip(x, y))
                 and torch.equal(s["state"], f["state"]) and torch.equal(s["dst"], f["dst"]))
    print(f"emulation builds: R={args.rows} T={args.queries} K={args.topk} capacity={args.capacity} "
          f"context={args.context} rows of {args.row_bytes} B; {args.steps} steps after {args.warmup} "
          f"warm-up (median {statistics.median(s['misses']):,.0f} misses/step); {machine()}")
    print("times are this machine's CPU per call (median), not NPU time")
    print(f"{'op':<8} {'strict wall ms':>15} {'strict cpu ms':>14} {'fast wall ms':>13} {'fast cpu ms':>12} "
          f"{'speed-up (cpu)':>15}")
    rows = {}
    for op in ("plan", "gather"):
        sw, sc = median_ms(s["times"][op], 0), median_ms(s["times"][op], 1)
        fw, fc = median_ms(f["times"][op], 0), median_ms(f["times"][op], 1)
        rows[op] = dict(strict_wall_ms=sw, strict_cpu_ms=sc, fast_wall_ms=fw, fast_cpu_ms=fc,
                        speedup_cpu=sc / fc if fc else float("inf"),
                        speedup_wall=sw / fw if fw else float("inf"))
        print(f"{op:<8} {sw:>15.2f} {sc:>14.2f} {fw:>13.2f} {fc:>12.2f} {rows[op]['speedup_cpu']:>14.1f}x")
    print(f"outputs, state and buffer identical across builds: {identical}")
    if args.json:
        write_json(args.json, dict(config=vars(args), machine=machine(), ops=rows, identical=identical))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
