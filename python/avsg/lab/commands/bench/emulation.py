"""``avsg bench emulation``: CPU time per call of plan and gather, strict vs fast emulation build.

Both builds run the same AscendC kernel sources (avsg.backend.set_emulation): strict checks every
rule of the emulation and counts the work, fast compiles that out. This times one decode step's
ops on the CPU backend, the same steps in both builds from the same start, and checks that the
outputs, the state and the buffer are identical. The numbers are this machine's CPU, not NPU time
(for that, see the counted-work estimates of 'avsg bench plan' / 'avsg bench gather').

Workload: R requests x T query tokens x top-K selections over a context, for each capacity S
of ``--capacity``: drawn from slowly drifting per-request scores (consecutive steps share most of
their selections, as decode steps do), or with ``--trace`` replayed from a selection trace (its
first R layers are the rows); a contiguous host pool of ``--row-bytes`` rows; gather with the
default miss partition.

Baseline, in the same run: the same job written in plain torch (:class:`TorchLRU`), batched over
rows: a dense position -> slot map per request, exact LRU eviction, one ``index_copy_`` of every
row's misses. Its output is checked every step (every selection reads its own host row). The fast
build's plan + gather per step is reported as a ratio to it, at the same torch thread count
(``--threads``), its steps interleaved with the fast build's. The baseline's policy is exact LRU, the op's ``--policy``, so their miss counts
may differ a little; both hit rates are printed.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Dict, List, Tuple

import torch

from .... import backend, reference
from ....buffer import SparseKVBuffer, gather, kv_slots
from ....cli_util import UsageError, check_memory_total, int_in
from ...traces.lookup import TRACE_HELP
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


def run(build: str, args, S: int, context: int, steps: List[torch.Tensor],
        host: torch.Tensor, paired: "TorchRun" = None) -> Dict[str, object]:
    """Plan + gather of every step in ``build``, timed; each step followed by one step of
    ``paired`` (the baseline), when given."""
    R = args.rows
    buf = SparseKVBuffer(rows=R, capacity=S, topk=args.topk, queries_per_step=args.queries,
                         device="cpu", check=False, max_context=context, policy=args.policy)
    dst = kv_slots(R * S, (args.row_bytes,), torch.uint8).view(R, S, args.row_bytes)
    dst.fill_(0)  # pages faulted in
    seq = torch.full((R,), context, dtype=torch.int32)
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
            if paired is not None:
                paired.step(i, topk, host)
    return dict(times=times, outputs=outputs, state=buf.state.clone(), dst=dst,
                misses=[int(o[3].sum()) for o in outputs[args.warmup:]])


class TorchLRU:
    """The plain-torch baseline, batched over rows (no Python loop over rows or selections).

    Layout, per request row ``r`` (the flat views index ``r * width + column``):
    ``slot_of_pos [R, context + 1]`` the dense position -> slot map, -1 absent; its last column
    is a sink that every invalid selection (-1 padding, or a position outside ``[0, context)``)
    and every free victim's "old position" addresses, so no step needs a boolean compaction to
    skip them; the sink only ever receives -1 and stays -1. ``pos_of_slot [R, S]`` the
    position each slot holds (-1 free), ``last_use [R, S]`` the step it was last selected (-1
    free), ``dst [R, S, row_bytes]`` the device buffer.

    One step: (1) look up every selection in the map, (2) stamp the hits' slots with the step
    (they are then the newest, so never victims), (3) de-duplicate the misses (MTP repeats) by
    scattering each entry's own tag into its map cell and keeping the entry that reads its tag
    back, (4) victims: per row the ``M_r`` smallest ``last_use`` (free slots first, then the
    least recently used; exact LRU) from one ``topk`` of the largest ``M_r`` over all rows,
    row ``r``'s ``j``-th miss takes its ``j``-th victim, (5) unmap the victims' old positions,
    map the new ones, (6) one ``index_copy_`` of all rows' misses, host pool -> ``dst``, over
    the widest words that divide a row, (7) read every selection's slot back from the map.
    """

    def __init__(self, rows: int, capacity: int, context: int, row_bytes: int):
        self.rows, self.capacity, self.context = rows, capacity, context
        self.slot_of_pos = torch.full((rows, context + 1), -1, dtype=torch.int64)
        self.pos_of_slot = torch.full((rows, capacity), -1, dtype=torch.int64)
        self.last_use = torch.full((rows, capacity), -1, dtype=torch.int64)
        # faulted in now, as the op's buffer is, so neither side times first-touch page faults
        self.dst = torch.zeros(rows, capacity, row_bytes, dtype=torch.uint8).fill_(0)
        self._dst_words = self._words(self.dst).view(rows * capacity, -1)
        self._map_base = torch.arange(rows, dtype=torch.int64)[:, None] * (context + 1)
        self.step = 0

    @staticmethod
    def _words(rows: torch.Tensor) -> torch.Tensor:
        width = rows.shape[-1]
        for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
            if width % size == 0:
                return rows.view(dtype)
        return rows

    def plan_and_copy(self, topk: torch.Tensor, host: torch.Tensor) -> Tuple[torch.Tensor, int]:
        """slots [R, T, K] of ``topk`` [R, T, K] (-1 where the selection is invalid) after
        copying the misses from ``host`` [R, context, row_bytes]; and the number of misses."""
        R, S, N = self.rows, self.capacity, self.context
        self.step += 1
        pos = topk.reshape(R, -1).long()
        pos = pos.masked_fill((pos < 0) | (pos >= N), N)            # invalid -> the sink column
        cell = (pos + self._map_base).view(-1)                      # flat map index per selection
        slot_map, pos_of_slot, last_use = (self.slot_of_pos.view(-1), self.pos_of_slot.view(-1),
                                           self.last_use.view(-1))
        slot = slot_map.index_select(0, cell)
        hit = slot >= 0
        row_of = self._row_of(pos.shape[1])
        last_use.index_fill_(0, (slot + row_of * S).masked_select(hit), self.step)
        miss = (~hit).logical_and_(pos.view(-1) < N).nonzero().view(-1)
        fetched = 0
        if miss.numel():
            miss_cell = cell.index_select(0, miss)
            tag = -2 - torch.arange(miss.numel(), dtype=torch.int64)
            slot_map.index_copy_(0, miss_cell, tag)                 # one writer per cell wins
            first = (slot_map.index_select(0, miss_cell) == tag).nonzero().view(-1)
            new_cell = miss_cell.index_select(0, first)             # unique misses, row-major
            new_row = row_of.index_select(0, miss.index_select(0, first))
            fetched = new_cell.numel()
            counts = torch.bincount(new_row, minlength=R)
            most = int(counts.max())
            rank = torch.arange(fetched) - (torch.cumsum(counts, 0) - counts).index_select(0, new_row)
            victims = torch.topk(self.last_use, most, dim=1, largest=False, sorted=True).indices
            victim_slot = victims.view(-1).index_select(0, new_row * most + rank)
            victim_flat = new_row * S + victim_slot
            new_pos = new_cell - new_row * (N + 1)
            old_pos = pos_of_slot.index_select(0, victim_flat)
            slot_map.index_fill_(0, old_pos.masked_fill_(old_pos < 0, N) + new_row * (N + 1), -1)
            slot_map.index_copy_(0, new_cell, victim_slot)
            pos_of_slot.index_copy_(0, victim_flat, new_pos)
            last_use.index_fill_(0, victim_flat, self.step)
            host_words = self._words(host).view(R * N, -1)
            self._dst_words.index_copy_(0, victim_flat,
                                        host_words.index_select(0, new_row * N + new_pos))
        return slot_map.index_select(0, cell).view(topk.shape), fetched

    def _row_of(self, per_row: int) -> torch.Tensor:
        """The row of each flattened selection, [R * per_row], kept across steps."""
        if getattr(self, "_rows_cache", (None,))[0] != per_row:
            self._rows_cache = (per_row, torch.arange(self.rows, dtype=torch.int64
                                                      ).repeat_interleave(per_row))
        return self._rows_cache[1]


class TorchRun:
    """The baseline driven one step at a time (:meth:`step`), so that ``run`` can interleave its
    steps with the op's. With ``check``, every step's read-back is compared with the host pool
    (every valid selection's slot holds its row, every invalid one is -1): that reads every
    selected row, so timed runs leave it to a separate checked replay of the same steps."""

    def __init__(self, args, S: int, context: int, check: bool):
        self.base = TorchLRU(args.rows, S, context, args.row_bytes)
        self.check = check
        self.warmup, self.context = args.warmup, context
        self.rows = torch.arange(args.rows)[:, None, None]
        self.times: List[Tuple[float, float]] = []
        self.misses: List[int] = []
        self.exact = True

    def step(self, i: int, topk: torch.Tensor, host: torch.Tensor) -> None:
        w0, c0 = time.perf_counter(), time.process_time()
        slots, missed = self.base.plan_and_copy(topk, host)
        w1, c1 = time.perf_counter(), time.process_time()
        if i >= self.warmup:
            self.times.append((w1 - w0, c1 - c0))
            self.misses.append(missed)
        if not self.check:
            return
        valid = (topk >= 0) & (topk < self.context)
        rows = self.rows.expand_as(topk)[valid]
        self.exact = self.exact and bool((slots[~valid] == -1).all()) and torch.equal(
            self.base.dst[rows, slots[valid]], host[rows, topk[valid].long()])

    def result(self) -> Dict[str, object]:
        return dict(times=self.times, misses=self.misses, exact=self.exact)


def trace_steps(trace: str, R: int, T: int, K: int, count: int) -> Tuple[List[torch.Tensor], int]:
    """``count`` steps [R, T, K] of the trace's first R layers (one request row per layer) and
    its context. Query token t of step s is trace step s + t (teacher-forced drafts); with K
    below the trace's top-k, the K positions that rank lowest under a fixed hash (as 'avsg
    bench plan' does), so reuse is preserved."""
    import numpy as np
    from ...traces.lookup import load_selections
    sel, _, context = load_selections(trace, R, count + T - 1, layers_option="--rows",
                                      steps_option="--warmup + --steps + --queries - 1")
    if K > sel.shape[2]:
        raise UsageError(f"--topk: the trace has top-{sel.shape[2]} selections, asked for {K}")
    prio = (sel.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(1 << 32)
    keep = np.argsort(prio, axis=2, kind="stable")[:, :, :K]
    sub = torch.from_numpy(np.sort(np.take_along_axis(sel, keep, axis=2), axis=2)).to(torch.int32)
    return [sub[:, s:s + T].contiguous() for s in range(count)], context


def median_ms(samples, which: int) -> float:
    return 1000.0 * statistics.median(s[which] for s in samples)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_in(1, 1024), default=4,
                        help="R: requests per call, 1..1024 (default 4)")
    parser.add_argument("--queries", type=int_in(1, 16), default=2,
                        help="T: query tokens per step, MTP, 1..16 (default 2)")
    parser.add_argument("--topk", type=int_in(1, 32768), default=2048,
                        help="K: selections per query token, 1..32768 (default 2048)")
    parser.add_argument("--capacity", default="8192",
                        help="S: slots per request, T x K..32768; a comma list measures each "
                             "(default 8192)")
    parser.add_argument("--context", type=int_in(1, 1 << 24), default=None,
                        help="positions per request, K..16777216 (default 16384; with --trace, "
                             "the trace's)")
    parser.add_argument("--trace", default=None,
                        help="replay a selection trace instead of the drifting synthetic scores: "
                             "its first --rows layers are the rows, query token t of step s is "
                             f"trace step s + t ({TRACE_HELP})")
    parser.add_argument("--policy", choices=sorted(reference.POLICY_IDS),
                        default=reference.DEFAULT_POLICY,
                        help=f"the op's residency policy (default {reference.DEFAULT_POLICY}); "
                             f"the plain-torch baseline is exact LRU")
    parser.add_argument("--threads", type=int_in(1, 256), default=1,
                        help="torch.set_num_threads for the whole run, both sides, 1..256 "
                             "(default 1: the fast build runs its blocks on one thread, and on a "
                             "shared 2-core machine a second intra-op thread mostly measures "
                             "how long the scheduler keeps it waiting)")
    parser.add_argument("--row-bytes", type=int_in(1, 65536), default=1152,
                        help="bytes per KV row, 1..65536 (default 1152: bf16 MLA)")
    parser.add_argument("--steps", type=int_in(1, 10000), default=12,
                        help="timed steps per build, after warm-up, 1..10000 (default 12)")
    parser.add_argument("--warmup", type=int_in(0, 10000), default=2,
                        help="untimed first steps, cold buffer, 0..10000 (default 2)")
    common.add_common_arguments(parser, "emulation", hw=False)
    common.add_tables_argument(parser, "docs/results/emulation.md")


def plot(points, path: str, title: str) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    x = range(len(points))
    series = (("strict build", "strict_ms", -0.27), ("fast build", "fast_ms", 0.0),
              ("plain torch", "torch_ms", 0.27))
    for label, key, dx in series:
        ax.bar([i + dx for i in x], [p[key] for p in points], 0.27, label=label)
    for i, p in enumerate(points):
        ax.annotate(f"{p['fast_over_torch']:.2f}x", (i, p["fast_ms"]), ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"S={p['S']}" for p in points])
    ax.set_yscale("log")
    ax.set_ylabel("CPU ms per step, plan + gather (median)")
    ax.set_title(title, fontsize=8)
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    for name in ("rows", "queries", "topk", "row_bytes", "steps"):
        common.at_least("--" + name.replace("_", "-"), getattr(args, name))
    common.at_least("--warmup", args.warmup, 0)
    capacities = common.int_list("--capacity", args.capacity, args.topk * args.queries, 32768)
    if args.device == "npu":
        common.require_npu("emulation")
        raise UsageError("--device npu: the emulation benchmark times the CPU emulation; use "
                         "'avsg bench plan --device npu' or 'avsg bench gather --device npu'")
    count = args.warmup + args.steps
    if args.trace is not None:
        if args.context is not None:
            raise UsageError("--context: the trace sets the context; not with --trace")
        from ...traces.lookup import TraceInputError
        try:
            steps, context = trace_steps(common.trace_path(args.trace), args.rows, args.queries,
                                         args.topk, count)
        except TraceInputError as e:
            raise UsageError(str(e)) from None
    else:
        context = 16384 if args.context is None else args.context
        if context < args.topk:
            raise UsageError(f"--context: expected >= --topk = {args.topk}, got {context}")
    check_memory_total([
        ("--context", 2 * args.rows * context * args.row_bytes,
         f"the host pools ({args.rows} rows x {context:,} positions x {args.row_bytes} B)"),
        ("--capacity", 3 * args.rows * max(capacities) * args.row_bytes, "the device buffers"),
        ("--steps", 4 * count * args.rows * args.queries * args.topk, "the selections")])
    out = common.out_dir(args, "emulation")
    if args.trace is None:
        steps = selections(args.rows, args.queries, args.topk, context, count)
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _measure(args, capacities, context, steps, out)
    finally:
        torch.set_num_threads(saved_threads)


def _measure(args, capacities: List[int], context: int, steps: List[torch.Tensor], out: str) -> int:
    from ...traces.lookup import trace_label
    host = torch.randint(0, 256, (args.rows, context, args.row_bytes), dtype=torch.uint8)
    threads = torch.get_num_threads()
    arch = backend.fast_emulation_arch()   # the fast side's speed depends on it (docs/backends.md)
    source = (f"trace {trace_label(common.trace_path(args.trace))}" if args.trace is not None
              else "drifting synthetic scores")
    print(f"emulation builds vs plain torch: R={args.rows} T={args.queries} K={args.topk} "
          f"context={context:,} ({source}), policy {args.policy}, rows of {args.row_bytes} B; "
          f"{args.steps} steps after {args.warmup} warm-up; torch threads {threads} (both sides); "
          f"{common.machine()}; fast build for {arch}")
    print("times are this machine's CPU per step (median), not NPU time; plain torch: batched "
          "dense pos -> slot map, exact LRU, index_copy_")
    print("each side alone, then interleaved step by step (fast = fast build plan + gather)")
    print(f"{'S':>6} {'hits':>6} {'strict plan':>12} {'strict gather':>14} {'fast plan':>10} "
          f"{'fast gather':>12} {'torch':>8} {'fast / torch':>13} {'inter fast':>10} "
          f"{'torch':>8} {'fast / torch':>13}   (cpu ms)")
    points, failures = [], []
    for S in capacities:
        # checked, untimed: the baseline's read-back, every step
        checked = TorchRun(args, S, context, check=True)
        for i, topk in enumerate(steps):
            checked.step(i, topk, host)
        # timed, two orders: each side alone (its caches warm from its own previous step), and
        # interleaved step by step (each step follows the other side's: caches as the other
        # side left them, as between the layers of a decode step; and the same load)
        results = {"strict": run("strict", args, S, context, steps, host),
                   "fast": run("fast", args, S, context, steps, host)}
        alone = TorchRun(args, S, context, check=False)
        for i, topk in enumerate(steps):
            alone.step(i, topk, host)
        interleaved = TorchRun(args, S, context, check=False)
        fast_interleaved = run("fast", args, S, context, steps, host, interleaved)
        baseline = alone.result()
        s, f = results["strict"], results["fast"]
        identical = all(
            all(torch.equal(a, b) for x, y in zip(s["outputs"], o["outputs"]) for a, b in zip(x, y))
            and torch.equal(s["state"], o["state"]) and torch.equal(s["dst"], o["dst"])
            for o in (f, fast_interleaved))
        baseline["exact"] = checked.exact and checked.misses == alone.misses == interleaved.misses
        ms = {f"{b}_{op}": median_ms(results[b]["times"][op], 1)
              for b in ("strict", "fast") for op in ("plan", "gather")}
        wall = {f"{b}_{op}_wall": median_ms(results[b]["times"][op], 0)
                for b in ("strict", "fast") for op in ("plan", "gather")}
        torch_ms, torch_wall = median_ms(baseline["times"], 1), median_ms(baseline["times"], 0)
        fast_ms = ms["fast_plan"] + ms["fast_gather"]
        inter_fast_ms = (median_ms(fast_interleaved["times"]["plan"], 1)
                         + median_ms(fast_interleaved["times"]["gather"], 1))
        inter_torch_ms = median_ms(interleaved.times, 1)
        lookups = args.rows * args.queries * args.topk
        point = dict(S=S, **ms, **wall, strict_ms=ms["strict_plan"] + ms["strict_gather"],
                     fast_ms=fast_ms, torch_ms=torch_ms, torch_wall_ms=torch_wall,
                     fast_over_torch=fast_ms / torch_ms if torch_ms else float("inf"),
                     interleaved_fast_ms=inter_fast_ms, interleaved_torch_ms=inter_torch_ms,
                     interleaved_fast_over_torch=(inter_fast_ms / inter_torch_ms if inter_torch_ms
                                                  else float("inf")),
                     op_misses_per_step=statistics.median(f["misses"]),
                     torch_misses_per_step=statistics.median(baseline["misses"]),
                     op_hit_rate=1 - statistics.mean(f["misses"]) / lookups,
                     torch_hit_rate=1 - statistics.mean(baseline["misses"]) / lookups,
                     identical=identical, torch_exact=baseline["exact"])
        points.append(point)
        print(f"{S:>6} {point['op_hit_rate']:>6.1%} {ms['strict_plan']:>12.2f} "
              f"{ms['strict_gather']:>14.2f} {ms['fast_plan']:>10.2f} {ms['fast_gather']:>12.2f} "
              f"{torch_ms:>8.2f} {point['fast_over_torch']:>12.2f}x {inter_fast_ms:>10.2f} "
              f"{inter_torch_ms:>8.2f} {point['interleaved_fast_over_torch']:>12.2f}x")
        if not identical:
            failures.append(f"strict and fast emulation builds disagree at S={S}")
        if not baseline["exact"]:
            failures.append(f"the plain-torch baseline read back the wrong rows at S={S}")
    print("hits: the op's share of lookups (unique misses per step); plain torch (exact LRU): "
          + ", ".join(f"S={p['S']} {p['torch_hit_rate']:.1%}" for p in points))
    print(f"outputs, state and buffer identical across builds: {all(p['identical'] for p in points)}; "
          f"plain torch read-back: {'exact' if all(p['torch_exact'] for p in points) else 'MISMATCH'}")
    config = {k: v for k, v in vars(args).items() if k not in ("func", "argv")}
    files = {"JSON": common.write_json(f"{out}/emulation.json", dict(
        command="avsg bench emulation", config=config, machine=common.machine(), context=context,
        torch_threads=threads, fast_emulation_arch=arch, points=points))}
    title = (f"CPU emulation vs plain torch, R={args.rows} T={args.queries} K={args.topk}, "
             f"{args.row_bytes} B rows, {args.policy}\n{common.machine()}, {threads} torch threads")
    files["plot"] = common.save_plot(f"{out}/emulation.png", lambda p: plot(points, p, title))
    tables = common.write_tables(args.tables, common.invocation(args), [common.markdown_table(
        "emulation", ["S", "op", "strict CPU ms", "fast CPU ms", "fast speed-up"],
        [[str(p["S"]), op, f"{p['strict_' + op]:.2f}", f"{p['fast_' + op]:.2f}",
          f"{p['strict_' + op] / p['fast_' + op]:.1f}x"] for p in points for op in ("plan", "gather")],
        "rlrrr"),
        common.markdown_table(
            "emulation-torch", ["S", "hits (op / torch LRU)", "fast build plan + gather CPU ms",
                                "plain torch CPU ms", "fast / torch", "interleaved: fast / torch"],
            [[str(p["S"]), f"{p['op_hit_rate']:.1%} / {p['torch_hit_rate']:.1%}", f"{p['fast_ms']:.2f}",
              f"{p['torch_ms']:.2f}", f"{p['fast_over_torch']:.2f}x",
              f"{p['interleaved_fast_ms']:.2f} / {p['interleaved_torch_ms']:.2f} = "
              f"{p['interleaved_fast_over_torch']:.2f}x"] for p in points], "rrrrrr")],
        note=f"Times are this machine's CPU per step (median), not NPU time; torch threads {threads}; "
             f"fast build for {arch} (AVSG_FAST_ARCH).")
    if tables:
        files["tables"] = tables
    common.report_outputs(files)
    if failures:
        raise RuntimeError("; ".join(failures))
    return 0
