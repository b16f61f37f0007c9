"""``avsg demo``: plan + gather over a few decode steps of a selection trace, checked and measured.

Each trace layer becomes one buffer row (one request per layer), so a single batched ``plan`` call
per step serves every layer. The host pool holds one 656-byte row per position (the FP8 MLA row
size: 512 latent bytes + 64 bf16 RoPE values + scales); ``gather`` copies only the misses. At the
end the demo reads back every selection of the last step through its slot and compares it with the
host pool, then prints the hit rate and the bytes moved against copying every selection.
"""
from __future__ import annotations

import argparse
import sys
import time
import torch

from .. import buffer as avsg_buffer, reference
from ..buffer import SparseKVBuffer, gather
from ..cli_util import UsageError, check_memory_total, int_in, progress_bar, reject_together
from ..lab.traces.lookup import (TRACE_HELP, find_trace, load_selections, synthetic_selections,
                             trace_label)

ROW_BYTES = 656
SYNTHETIC_TOPK, SYNTHETIC_CONTEXT = 2048, 16384
MAX_CAPACITY = 1 << 15         # slots per row the buffer takes
def check_sizes(layers: int, steps: int, k: int, context: int, capacity: int) -> None:
    """Everything the demo allocates, against this machine's memory, before allocating it."""
    check_memory_total([
        ("--layers", layers * context * ROW_BYTES,
         f"the host pool ({layers:,} layers x {context:,} positions x {ROW_BYTES} B)"),
        ("--capacity", layers * capacity * ROW_BYTES,
         f"the device buffer ({layers:,} x {capacity:,} slots x {ROW_BYTES} B)"),
        ("--steps", 8 * layers * steps * k,
         f"the selections ({layers:,} x {steps:,} steps x top-{k:,})")])


def run(trace: str, layers: int, steps: int, capacity: int, synthetic: bool,
        lifetime: int, seed: int = 0) -> dict:
    if synthetic:
        source = "synthetic (75% step-to-step overlap)"
        check_sizes(layers, steps, SYNTHETIC_TOPK, SYNTHETIC_CONTEXT + steps, capacity)
        sel, positions, context = synthetic_selections(layers, steps, SYNTHETIC_TOPK,
                                                       SYNTHETIC_CONTEXT, seed)
    else:
        source = f"trace {trace_label(trace)}"
        sel, positions, context = load_selections(trace, layers, steps)
        check_sizes(layers, steps, sel.shape[2], context, capacity)
    layers, steps, k = sel.shape
    if capacity < k:
        raise UsageError(f"--capacity: expected >= the trace's top-k ({k}), got {capacity}")
    gen = torch.Generator().manual_seed(seed)
    host_pool = torch.randint(0, 256, (layers, context, ROW_BYTES), dtype=torch.uint8,
                              generator=gen)
    device_buffer = avsg_buffer.kv_slots(layers * capacity, (ROW_BYTES,), torch.uint8).view(
        layers, capacity, ROW_BYTES)
    buf = SparseKVBuffer(rows=layers, capacity=capacity, topk=k, lifetime=lifetime,
                         max_context=context)
    print(f"avsg demo: {source}: {layers} layers as buffer rows, {steps} steps, top-{k}, "
          f"capacity {capacity} slots x {ROW_BYTES} B, host pool {host_pool.numel() / 2**20:.0f}"
          f" MiB, {avsg_buffer.get_num_cores()} gather cores")
    copied = 0
    started = time.perf_counter()
    bar = progress_bar(steps, "plan + gather", "step", sys.stderr.isatty())
    for step in range(steps):
        topk = torch.from_numpy(sel[:, step]).to(torch.int32).view(layers, 1, k)
        # the query at position p attends to 0..p, itself included
        seq_lens = torch.full((layers,), int(positions[step]) + 1, dtype=torch.int32)
        plan = buf.plan(topk, seq_lens)
        gather(plan, host_pool, device_buffer)
        copied += int(plan.miss_counts.sum())
        bar.update(1)
    bar.close()
    elapsed = time.perf_counter() - started
    # self-check: attention would read exactly the host rows through the last step's slots
    rows = torch.arange(layers)[:, None, None].expand_as(topk)
    valid = plan.slots >= 0
    read = device_buffer[rows[valid], plan.slots[valid].long()]
    expected = host_pool[rows[valid], topk[valid].long()]
    exact = bool(torch.equal(read, expected))
    stats = buf.stats()
    everything = layers * steps * k
    result = dict(source=source, layers=layers, steps=steps, topk=k, capacity=capacity,
                  hit_rate=stats["hit_rate"], rows_copied=copied, rows_if_offload=everything,
                  bytes_copied=copied * ROW_BYTES, bytes_if_offload=everything * ROW_BYTES,
                  exact=exact, seconds=elapsed)
    print(f"  hit rate          {100 * stats['hit_rate']:.1f}%  (first step is a cold start)")
    print(f"  rows copied       {copied:,} of {everything:,} selected "
          f"({100 * copied / everything:.1f}%)")
    print(f"  bytes moved H2D   {copied * ROW_BYTES / 2**20:,.1f} MiB vs "
          f"{everything * ROW_BYTES / 2**20:,.1f} MiB copying every selection "
          f"({everything / max(copied, 1):.1f}x less)")
    print(f"  read-back check   {'exact: every selection reads its host row' if exact else 'MISMATCH'}")
    print(f"  CPU time          {elapsed:.1f} s for {steps} steps "
          f"(CPU backend: {'kernels' if _uses_kernels() else 'reference'}; not NPU time)")
    if not exact:
        raise SystemExit("avsg demo: read-back mismatch")
    return result


def _uses_kernels() -> bool:
    from .. import _ops
    return _ops.CPU_BACKEND.get("plan") == "kernel"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", help=f"selection trace: {TRACE_HELP}")
    parser.add_argument("--synthetic", action="store_true",
                        help="use a synthetic stream (not with --trace)")
    parser.add_argument("--layers", type=int_in(1, 4096), default=4,
                        help="trace layers to replay, each as one buffer row, 1..4096 (default 4)")
    parser.add_argument("--steps", type=int_in(1, 1 << 20), default=32,
                        help="decode steps, 1..1048576 (default 32)")
    parser.add_argument("--capacity", type=int_in(SYNTHETIC_TOPK, MAX_CAPACITY), default=8192,
                        help=f"buffer slots per row, {SYNTHETIC_TOPK}..{MAX_CAPACITY} "
                             f"(>= the trace's top-k; default 8192)")
    parser.add_argument("--lifetime", type=int_in(1, 255), default=reference.DEFAULT_LIFETIME,
                        help=f"buffer lifetime, 1..255 (default {reference.DEFAULT_LIFETIME})")


def main(args: argparse.Namespace) -> int:
    reject_together(args, "--synthetic", "--trace", "--synthetic replays a generated stream, "
                    "--trace a file; give one")
    run(find_trace(args.trace), args.layers, args.steps, args.capacity, args.synthetic,
        args.lifetime)
    return 0
