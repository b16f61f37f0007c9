"""``avsg bench emulation``: CPU time per call of plan and gather, strict vs fast emulation build.

Both builds run the same AscendC kernel sources (avsg.backend.set_emulation): strict checks every
rule of the emulation and counts the work, fast compiles that out. This times one decode step's
ops on the CPU backend, the same steps in both builds from the same start, and checks that the
outputs, the state and the buffer are identical. The numbers are this machine's CPU, not NPU time
(for that, see the counted-work estimates of 'avsg bench plan' / 'avsg bench gather').

Workload: R requests x T query tokens x top-K selections over a context, drawn from slowly
drifting per-request scores (consecutive steps share most of their selections, as decode steps
do); a contiguous host pool of ``--row-bytes`` rows; gather with the default miss partition.

Baseline, in the same run: the same job written in plain torch (:func:`torch_step`): a dense
position -> slot map per request, exact LRU eviction, ``index_copy_`` of the misses. The fast
build's plan + gather per step is reported as a ratio to it. The baseline's policy is LRU, the
op's the buffer's default, so their miss counts differ a little; both are printed.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Dict, List, Tuple

import torch

from ... import backend
from ...buffer import SparseKVBuffer, gather, kv_slots
from ...cli_util import UsageError, check_memory_total, int_in
from . import common


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
    dst = kv_slots(R * args.capacity, (args.row_bytes,), torch.uint8).view(R, args.capacity, args.row_bytes)
    dst.fill_(0)  # pages faulted
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


class TorchLRU:
    """The plain-torch baseline: per request a dense ``slot_of_pos`` [context] table, the slot's
    position and last use, exact LRU (free slots first, never a slot hit this step)."""

    def __init__(self, rows: int, capacity: int, context: int, row_bytes: int):
        self.slot_of_pos = torch.full((rows, context), -1, dtype=torch.int64)
        self.pos_of_slot = torch.full((rows, capacity), -1, dtype=torch.int64)
        self.last_use = torch.full((rows, capacity), -1, dtype=torch.int64)
        # faulted in now, as the op's buffer is, so neither side times first-touch page faults
        self.dst = torch.zeros(rows, capacity, row_bytes, dtype=torch.uint8).fill_(0)
        self.step = 0

    @staticmethod
    def _words(rows: torch.Tensor) -> torch.Tensor:
        width = rows.shape[-1]
        for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
            if width % size == 0:
                return rows.view(dtype)
        return rows

    def plan_and_copy(self, topk: torch.Tensor, host: torch.Tensor) -> Tuple[torch.Tensor, int]:
        """slots [R, T, K] of ``topk`` [R, T, K] after copying the misses; and the miss count."""
        self.step += 1
        misses = 0
        for r in range(topk.shape[0]):
            pos = torch.unique(topk[r].reshape(-1).long())
            slot = self.slot_of_pos[r, pos]
            hit = slot >= 0
            self.last_use[r, slot[hit]] = self.step
            new_pos = pos[~hit]
            if new_pos.numel():
                victim = torch.topk(self.last_use[r], new_pos.numel(), largest=False).indices
                old = self.pos_of_slot[r, victim]
                self.slot_of_pos[r, old[old >= 0]] = -1
                self.slot_of_pos[r, new_pos] = victim
                self.pos_of_slot[r, victim] = new_pos
                self.last_use[r, victim] = self.step
                # rows as the widest words that divide them: torch copies uint8 rows byte by byte
                self._words(self.dst)[r].index_copy_(0, victim,
                                                     self._words(host)[r].index_select(0, new_pos))
                misses += new_pos.numel()
        return torch.gather(self.slot_of_pos, 1, topk.reshape(topk.shape[0], -1).long()
                            ).view(topk.shape), misses


def run_torch(args, steps: List[torch.Tensor], host: torch.Tensor) -> Dict[str, object]:
    base = TorchLRU(args.rows, args.capacity, args.context, args.row_bytes)
    times, misses = [], []
    exact = True
    for i, topk in enumerate(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        slots, missed = base.plan_and_copy(topk, host)
        w1, c1 = time.perf_counter(), time.process_time()
        if i >= args.warmup:
            times.append((w1 - w0, c1 - c0))
            misses.append(missed)
        rows = torch.arange(args.rows)[:, None, None].expand_as(topk)
        exact = exact and torch.equal(base.dst[rows, slots], host[rows, topk.long()])
    return dict(times=times, misses=misses, exact=exact)


def median_ms(samples, which: int) -> float:
    return 1000.0 * statistics.median(s[which] for s in samples)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_in(1, 1024), default=4,
                        help="R: requests per call, 1..1024 (default 4)")
    parser.add_argument("--queries", type=int_in(1, 16), default=2,
                        help="T: query tokens per step, MTP, 1..16 (default 2)")
    parser.add_argument("--topk", type=int_in(1, 32768), default=2048,
                        help="K: selections per query token, 1..32768 (default 2048)")
    parser.add_argument("--capacity", type=int_in(1, 32768), default=8192,
                        help="slots per request, T x K..32768 (default 8192)")
    parser.add_argument("--context", type=int_in(1, 1 << 24), default=16384,
                        help="positions per request, K..16777216 (default 16384)")
    parser.add_argument("--row-bytes", type=int_in(1, 65536), default=1152,
                        help="bytes per KV row, 1..65536 (default 1152: bf16 MLA)")
    parser.add_argument("--steps", type=int_in(1, 10000), default=12,
                        help="timed steps per build, after warm-up, 1..10000 (default 12)")
    parser.add_argument("--warmup", type=int_in(0, 10000), default=2,
                        help="untimed first steps, cold buffer, 0..10000 (default 2)")
    common.add_common_arguments(parser, "emulation", hw=False)
    common.add_tables_argument(parser, "docs/results/emulation.md")


def plot(rows, path: str, title: str) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ops = list(rows)
    x = range(len(ops))
    ax.bar([i - 0.2 for i in x], [rows[o]["strict_cpu_ms"] for o in ops], 0.4, label="strict build")
    ax.bar([i + 0.2 for i in x], [rows[o]["fast_cpu_ms"] for o in ops], 0.4, label="fast build")
    for i, o in enumerate(ops):
        ax.annotate(f"{rows[o]['speedup_cpu']:.1f}x", (i + 0.2, rows[o]["fast_cpu_ms"]),
                    ha="center", va="bottom")
    ax.set_xticks(list(x))
    ax.set_xticklabels(ops)
    ax.set_ylabel("CPU ms per call (median)")
    ax.set_title(title, fontsize=8)
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    for name in ("rows", "queries", "topk", "capacity", "context", "row_bytes", "steps"):
        common.at_least("--" + name.replace("_", "-"), getattr(args, name))
    common.at_least("--warmup", args.warmup, 0)
    if args.capacity < args.topk * args.queries:
        raise UsageError(f"--capacity: expected >= topk x queries = {args.topk * args.queries}, "
                         f"got {args.capacity}")
    if args.context < args.topk:
        raise UsageError(f"--context: expected >= --topk = {args.topk}, got {args.context}")
    if args.device == "npu":
        common.require_npu("emulation")
        raise UsageError("--device npu: the emulation benchmark times the CPU emulation; use "
                         "'avsg bench plan --device npu' or 'avsg bench gather --device npu'")
    check_memory_total([
        ("--context", 2 * args.rows * args.context * args.row_bytes,
         f"the host pools ({args.rows} rows x {args.context:,} positions x {args.row_bytes} B)"),
        ("--capacity", 2 * args.rows * args.capacity * args.row_bytes, "the device buffers"),
        ("--steps", 4 * (args.warmup + args.steps) * args.rows * args.queries * args.topk,
         "the selections")])
    out = common.out_dir(args, "emulation")
    steps = selections(args.rows, args.queries, args.topk, args.context, args.warmup + args.steps)
    host = torch.randint(0, 256, (args.rows, args.context, args.row_bytes), dtype=torch.uint8)
    results = {b: run(b, args, steps, host) for b in ("strict", "fast")}
    baseline = run_torch(args, steps, host)

    s, f = results["strict"], results["fast"]
    identical = (all(torch.equal(a, b) for x, y in zip(s["outputs"], f["outputs"]) for a, b in zip(x, y))
                 and torch.equal(s["state"], f["state"]) and torch.equal(s["dst"], f["dst"]))
    print(f"emulation builds: R={args.rows} T={args.queries} K={args.topk} capacity={args.capacity} "
          f"context={args.context} rows of {args.row_bytes} B; {args.steps} steps after {args.warmup} "
          f"warm-up (median {statistics.median(s['misses']):,.0f} misses/step); {common.machine()}")
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
    torch_wall, torch_cpu = median_ms(baseline["times"], 0), median_ms(baseline["times"], 1)
    fast_step = rows["plan"]["fast_cpu_ms"] + rows["gather"]["fast_cpu_ms"]
    ratio = fast_step / torch_cpu if torch_cpu else float("inf")
    print(f"plain torch (dense pos -> slot map, exact LRU, index_copy_): {torch_cpu:.2f} cpu ms "
          f"per step ({torch_wall:.2f} wall; median {statistics.median(baseline['misses']):,.0f} "
          f"misses/step; read-back {'exact' if baseline['exact'] else 'MISMATCH'}); fast build "
          f"plan + gather {fast_step:.2f} cpu ms = {ratio:.2f}x plain torch")
    baseline_row = dict(cpu_ms=torch_cpu, wall_ms=torch_wall, exact=baseline["exact"],
                        misses_per_step=statistics.median(baseline["misses"]),
                        fast_plan_gather_cpu_ms=fast_step, fast_over_torch=ratio)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    files = {"JSON": common.write_json(f"{out}/emulation.json", dict(
        command="avsg bench emulation", config=config, machine=common.machine(), ops=rows,
        identical=identical, plain_torch=baseline_row))}
    title = (f"CPU emulation, R={args.rows} T={args.queries} K={args.topk} S={args.capacity}, "
             f"{args.row_bytes} B rows\n{common.machine()}")
    files["plot"] = common.save_plot(f"{out}/emulation.png", lambda p: plot(rows, p, title))
    tables = common.write_tables(args.tables, common.invocation(args), [common.markdown_table(
        "emulation", ["op", "strict CPU ms", "fast CPU ms", "fast speed-up"],
        [[op, f"{r['strict_cpu_ms']:.2f}", f"{r['fast_cpu_ms']:.2f}", f"{r['speedup_cpu']:.1f}x"]
         for op, r in rows.items()], "lrrr"),
        common.markdown_table(
            "emulation-torch", ["step", "fast build CPU ms", "plain torch CPU ms", "fast / torch"],
            [["plan + gather", f"{fast_step:.2f}", f"{torch_cpu:.2f}", f"{ratio:.2f}x"]], "lrrr")],
        note="Times are this machine's CPU per call (median), not NPU time.")
    if tables:
        files["tables"] = tables
    common.report_outputs(files)
    if not identical:
        raise RuntimeError("strict and fast emulation builds disagree")
    if not baseline["exact"]:
        raise RuntimeError("the plain-torch baseline read back the wrong rows")
    return 0
