"""How many hash buckets per slot? Index overflow (stash) against table size, on a real trace.

The hash index gives each position 4 probe buckets; a miss that finds none of them free goes to
the stash, which every later lookup that misses the table must scan. This replays a trace with
the real ``plan`` op for several ``hash_buckets / capacity`` ratios and reports the stash
occupancy after each step, the share of misses that overflowed, and the table's size in UB terms.
Hit rates are identical across ratios by construction (the index never changes what is resident).

    python -m avsg.bench.hash_buckets [--trace T] [--layers 24] [--steps 128] [--capacity 8192]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from .. import reference
from ..buffer import SparseKVBuffer
from ..demo import find_trace, load_selections


def replay(sel, positions, capacity: int, buckets: int) -> dict:
    layers, steps, k = sel.shape
    # the index under test does not depend on the policy: the paper's lifetime policy
    buf = SparseKVBuffer(rows=layers, capacity=capacity, topk=k, hash_buckets=buckets,
                         check=False, policy="lifetime")
    stash_after = []
    stashed = 0
    started = time.perf_counter()
    for step in range(steps):
        topk = torch.from_numpy(sel[:, step]).to(torch.int32).view(layers, 1, k)
        seq = torch.full((layers,), int(positions[step]) + 1, dtype=torch.int32)
        before = reference.view_state(buf.state, buf.layout).stash_count.clone()
        buf.plan(topk, seq)
        after = reference.view_state(buf.state, buf.layout).stash_count.clone()
        stash_after.append(after.numpy().copy())
        stashed += int((after - before).clamp(min=0).sum())
    stats = buf.stats()
    stash = np.stack(stash_after)
    return dict(capacity=capacity, buckets=buckets, ratio=buckets / capacity,
                hit_rate=stats["hit_rate"], fetched=stats["fetched"],
                stash_mean=float(stash.mean()), stash_max=int(stash.max()),
                overflow_share=stashed / max(stats["fetched"], 1),
                table_kib=2 * buckets * 4 / 1024, seconds=time.perf_counter() - started)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--capacity", type=int, default=8192)
    parser.add_argument("--ratios", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--json", default="results/hash_buckets.json")
    args = parser.parse_args(argv)
    trace = find_trace(args.trace)
    if trace is None:
        raise SystemExit("no trace: pass --trace (the shared one is ../shared/traces/asyncio_32k.npz)")
    sel, positions, _ = load_selections(trace, args.layers, args.steps)
    rows = [replay(sel, positions, args.capacity, args.capacity * r) for r in args.ratios
            if args.capacity * r <= reference.MAX_BUCKETS]
    print(f"trace {trace}: {sel.shape[0]} layers x {sel.shape[1]} steps, top-{sel.shape[2]}, "
          f"capacity {args.capacity}")
    print(f"{'H/S':>4} {'buckets':>8} {'table KiB':>9} {'hit rate':>8} {'stash mean':>10} "
          f"{'stash max':>9} {'misses stashed':>14}")
    for r in rows:
        print(f"{r['ratio']:>4.0f} {r['buckets']:>8} {r['table_kib']:>9.0f} "
              f"{100 * r['hit_rate']:>7.2f}% {r['stash_mean']:>10.1f} {r['stash_max']:>9} "
              f"{100 * r['overflow_share']:>13.2f}%")
    import os
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(trace=trace, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
