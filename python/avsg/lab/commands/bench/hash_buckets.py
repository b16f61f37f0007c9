"""``avsg bench hash-buckets``: how many hash buckets per slot? Index overflow against table size.

The hash index gives each position 4 probe buckets; a miss that finds none of them free goes to
the stash, which every later lookup that misses the table must scan. This replays a selection
trace (the embedded one by default) with the real
``plan`` op for several ``hash_buckets / capacity`` ratios and reports the stash occupancy after
each step, the share of misses that overflowed, and the table's size. Hit rates are identical
across ratios by construction (the index never changes what is resident), so hit rate against
capacity is the trace lab's plot (``avsg trace replay``), not this one's.
"""
from __future__ import annotations

import argparse
import time
from typing import Dict, List

import numpy as np
import torch

from .... import backend, reference
from ....buffer import SparseKVBuffer
from ....cli_util import UsageError, check_memory, int_in
from ...traces.lookup import TRACE_HELP
from . import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", help=f"selection trace: {TRACE_HELP}")
    parser.add_argument("--layers", type=int_in(1, 4096),
                        help="trace layers replayed, one buffer row each, 1..4096 (default: all "
                             "of the trace's)")
    parser.add_argument("--steps", type=int_in(1, 1 << 20), default=96,
                        help="trace steps replayed, 1..1048576 (default 96)")
    parser.add_argument("--capacity", type=int_in(1, 32768), default=8192,
                        help="slots per row, top-k..32768 (default 8192)")
    parser.add_argument("--ratios", default="1,2,4",
                        help="hash buckets per slot H/S, comma-separated powers of two (default 1,2,4)")
    common.add_common_arguments(parser, "hash-buckets", hw=False)
    common.add_tables_argument(parser, "docs/results/hash_buckets.md")


def replay(sel, positions, capacity: int, buckets: int, device: str, progress) -> Dict:
    layers, steps, k = sel.shape
    # the index under test does not depend on the policy: the paper's lifetime policy
    buf = SparseKVBuffer(rows=layers, capacity=capacity, topk=k, hash_buckets=buckets,
                         check=False, policy="lifetime", device=device, track_copies=False)
    stash_after = []
    stashed = 0
    started = time.perf_counter()
    for step in range(steps):
        topk = torch.from_numpy(sel[:, step]).to(torch.int32).view(layers, 1, k).to(device)
        seq = torch.full((layers,), int(positions[step]) + 1, dtype=torch.int32, device=device)
        before = reference.view_state(buf.state, buf.layout).stash_count.cpu().clone()
        buf.plan(topk, seq)
        after = reference.view_state(buf.state, buf.layout).stash_count.cpu().clone()
        stash_after.append(after.numpy().copy())
        stashed += int((after - before).clamp(min=0).sum())
        progress.update()
    stats = buf.stats()
    stash = np.stack(stash_after)
    return dict(capacity=capacity, buckets=buckets, ratio=buckets / capacity,
                hit_rate=stats["hit_rate"], fetched=stats["fetched"],
                stash_mean=float(stash.mean()), stash_max=int(stash.max()),
                overflow_share=stashed / max(stats["fetched"], 1),
                table_kib=2 * buckets * 4 / 1024, seconds=time.perf_counter() - started)


def plot(rows: List[Dict], path: str, title: str) -> None:
    plt = common.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"H/S={r['ratio']:g}\n{r['table_kib']:.0f} KiB" for r in rows]
    a.bar(labels, [100 * r["overflow_share"] for r in rows], color="tab:blue")
    a.set_ylabel("misses that overflowed to the stash (%)")
    a.set_title("overflow vs table size")
    b.bar(labels, [r["stash_mean"] for r in rows], color="tab:orange", label="mean")
    b.scatter(labels, [r["stash_max"] for r in rows], color="k", marker="_", s=400, label="max")
    b.set_ylabel("stash entries per row after a step")
    b.set_title("stash occupancy vs table size")
    b.legend()
    for ax in (a, b):
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    from ...traces.lookup import load_selections, trace_label
    if args.layers is not None:
        common.at_least("--layers", args.layers)
    common.at_least("--steps", args.steps)
    common.at_least("--capacity", args.capacity)
    ratios = common.int_list("--ratios", args.ratios)
    for r in ratios:
        if r & (r - 1):
            raise UsageError(f"--ratios: expected powers of two, got {r}")
        if args.capacity * r > reference.MAX_BUCKETS:
            raise UsageError(f"--ratios: capacity {args.capacity} x {r} exceeds the largest table "
                             f"({reference.MAX_BUCKETS} buckets)")
        if args.capacity * r < reference.VECTOR_INT32:
            raise UsageError(f"--ratios: capacity {args.capacity} x {r} is below the smallest table "
                             f"({reference.VECTOR_INT32} buckets)")
    if args.device == "npu":
        common.require_npu("hash-buckets")
    out = common.out_dir(args, "hash-buckets")
    trace = common.trace_path(args.trace)
    sel, positions, _ = load_selections(trace, args.layers, args.steps)
    source = f"trace {trace_label(trace)}"
    if sel.shape[2] > args.capacity:
        raise UsageError(f"--capacity: expected >= the trace's top-{sel.shape[2]}, got {args.capacity}")
    progress = common.bar(len(ratios) * sel.shape[1], "hash-buckets", args)
    try:
        with backend.emulation("fast"):   # same results as strict; nothing here is timed
            rows = [replay(sel, positions, args.capacity, args.capacity * r, args.device, progress)
                    for r in ratios]
    finally:
        progress.close()
    head = (f"avsg bench hash-buckets: {source}: {sel.shape[0]} layers x {sel.shape[1]} steps, "
            f"top-{sel.shape[2]}, capacity {args.capacity}")
    print(head)
    print(f"{'H/S':>4} {'buckets':>8} {'table KiB':>9} {'hit rate':>8} {'stash mean':>10} "
          f"{'stash max':>9} {'misses stashed':>14}")
    for r in rows:
        print(f"{r['ratio']:>4.0f} {r['buckets']:>8} {r['table_kib']:>9.0f} "
              f"{100 * r['hit_rate']:>7.2f}% {r['stash_mean']:>10.1f} {r['stash_max']:>9} "
              f"{100 * r['overflow_share']:>13.2f}%")
    files = {"JSON": common.write_json(f"{out}/hash_buckets.json", dict(
        command="avsg bench hash-buckets", trace=trace, source=source, layers=sel.shape[0],
        steps=sel.shape[1], topk=sel.shape[2], capacity=args.capacity, machine=common.machine(),
        rows=rows))}
    files["plot"] = common.save_plot(
        f"{out}/hash_buckets.png",
        lambda p: plot(rows, p, head.replace("avsg bench hash-buckets: ", "")))
    table = [[f"{r['ratio']:g}", f"{r['table_kib']:.0f} KiB", f"{100 * r['hit_rate']:.2f}%",
              f"{r['stash_mean']:.1f} / {r['stash_max']}", f"{100 * r['overflow_share']:.2f}%"]
             for r in rows]
    tables = common.write_tables(args.tables, common.invocation(args), [common.markdown_table(
        "hash-buckets", ["H/S", "table", "hit rate", "stash entries (mean / max)",
                         "misses that overflowed"], table, "rrrrr")],
        note="Counts from replaying the trace with the real plan op; nothing is timed.")
    if tables:
        files["tables"] = tables
    common.report_outputs(files)
    return 0
