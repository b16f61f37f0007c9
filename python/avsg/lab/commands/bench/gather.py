"""``avsg bench gather``: the gather kernel's core partitions on the paper's grid, link-aware.

S1 ``request`` (a request's misses on one core), S2 ``selection`` (the paper's: the R x K
selections split evenly over cores, hits no-ops), S3 ``miss`` (AVSG: the batch's misses cut into
equal chunks), and the older ``topk`` split of the compacted miss list (labelled: it behaves like
S1). Every configuration runs all partitions on the same miss lists through the strict CPU
emulation of the AscendC kernel (40 emulated AIV cores), checks that they write the same bytes,
and turns each launch's counted work into a modelled time with the hardware profile (``--hw``):
serial-pipe and overlapped-pipe, each with the host link (H2D bytes / link bandwidth, and per core
rows x host DMA latency / rows in flight), so the effective bandwidth never exceeds the link.

Workload (synthetic, stated): per request K = 2048 selections, ascending positions of a 4K-token
context (the order of the shared trace's selections); a request's miss rate is the grid's rate
scaled by a log-normal weight (sigma 0.5, mean 1, clipped to 1), half its misses the most recent
selections (new tokens), half spread over the rest. The same run times this machine's CPU: the
fast-emulation gather and a torch index copy against a plain memcpy of the same bytes.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Dict, List

import numpy as np
import torch

from .... import backend
from ....buffer import kv_slots
from ....cli_util import UsageError, float_in, int_in
from ...costmodel import hardware
from . import common

PARTITIONS = (("S1", "request"), ("S2", "selection"), ("S3", "miss"), ("S2-list", "topk"))
LABELS = {"request": "S1 request", "selection": "S2 selection (paper)", "miss": "S3 miss (AVSG)",
          "topk": "topk list split (old S2, behaves like S1)"}
PAPER = {"S3/S1": 34.44, "S3/S2": 3.48}
K = 2048


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", default="1,2,4,8,16,32",
                        help="requests per launch, comma-separated, 1..1024 (default "
                             "1,2,4,8,16,32)")
    parser.add_argument("--miss-rate", default="0.25,0.5,0.75,1.0",
                        help="mean share of a request's selections that miss (default "
                             "0.25,0.5,0.75,1.0)")
    parser.add_argument("--row-bytes", default="656,1152",
                        help="bytes per KV row, 1..65536: 656 FP8 MLA, 1152 bf16 MLA (default "
                             "656,1152)")
    parser.add_argument("--topk", type=int_in(1, 32768), default=K,
                        help=f"selections per request, 1..32768 (default {K})")
    parser.add_argument("--cores", type=int_in(1, 48), default=40,
                        help="emulated AIV cores = blocks per launch, 1..48 (default 40, a 910B3/B4)")
    parser.add_argument("--link-gbps", type=float_in(0, 1e4, low_open=True),
                        help="override the profile's host link, GB/s, in (0, 1e4]")
    parser.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0,
                        help="workload seed, >= 0 (default 0)")
    common.add_common_arguments(parser, "gather")
    common.add_tables_argument(parser, "docs/results/gather.md")


def workload(batch: int, rate: float, k: int, seed: int):
    """Miss lists in the plan's layout and in the selection layout, for ``batch`` requests."""
    rng = np.random.default_rng(seed)
    context, capacity = 2 * k, 2 * k
    w = rng.lognormal(0.0, 0.5, batch)
    w = w / w.mean()
    counts = np.minimum(np.round(rate * w * k), k).astype(np.int64)
    miss_pos = np.full((batch, k), -1, np.int32)
    miss_slots = np.full((batch, k), -1, np.int32)
    sel_pos = np.full((batch, k), -1, np.int32)
    sel_slots = np.full((batch, k), -1, np.int32)
    for r in range(batch):
        sel = np.sort(rng.choice(context, size=k, replace=False)).astype(np.int32)
        m = int(counts[r])
        tail = m // 2
        rest = rng.choice(k - tail, size=m - tail, replace=False) if m > tail else np.empty(0, int)
        missed = np.zeros(k, bool)
        missed[k - tail:] = True
        missed[rest] = True
        slots = rng.permutation(capacity)[:m].astype(np.int32)
        miss_pos[r, :m] = sel[missed]
        miss_slots[r, :m] = slots
        sel_pos[r, missed] = sel[missed]
        sel_slots[r, missed] = slots
    t = lambda a: torch.from_numpy(a)  # noqa: E731
    return dict(context=context, capacity=capacity, counts=t(counts.astype(np.int32)),
                miss_pos=t(miss_pos), miss_slots=t(miss_slots), sel_pos=t(sel_pos),
                sel_slots=t(sel_slots))


def run_config(batch, rate, row_bytes, args, hw, host_cache) -> Dict:
    w = workload(batch, rate, args.topk, args.seed + 1000 * batch + int(100 * rate))
    key = (batch, w["context"], row_bytes)
    if key not in host_cache:
        host_cache.clear()
        host_cache[key] = torch.randint(0, 256, (batch, w["context"], row_bytes), dtype=torch.uint8)
    host = host_cache[key]
    misses = int(w["counts"].sum())
    out = dict(batch=batch, miss_rate=rate, row_bytes=row_bytes, misses=misses,
               actual_miss_rate=misses / (batch * args.topk), partitions={})
    want = None
    for label, partition in PARTITIONS:
        dst = kv_slots(batch * w["capacity"], (row_bytes,), torch.uint8).view(batch, w["capacity"], row_bytes)
        pos, slots = ((w["sel_pos"], w["sel_slots"]) if partition == "selection"
                      else (w["miss_pos"], w["miss_slots"]))
        per_core = torch.ops.avsg.gather(pos, slots, w["counts"], [host], [dst], None, 0,
                                         partition, args.cores)
        counters = backend.last_launch_counters()
        est = hardware.gather_estimate(counters, hw, per_core, row_bytes)
        core_only = hardware.launch_estimate(counters, hw)
        if want is None:
            want = dst
        elif not torch.equal(dst, want):
            raise RuntimeError(f"gather partition {partition} wrote different bytes")
        measured = npu_gather_us(pos, slots, w["counts"], host, dst.shape, partition,
                                 args.cores) if args.device == "npu" else None
        load = per_core.double()
        out["partitions"][partition] = dict(npu_measured_us=measured,
            label=label, busiest_share=float(load.max() / load.sum()) if misses else 0.0,
            busiest_rows=int(load.max()), core_serial_pipe_us=core_only["serial_pipe_us"],
            core_overlapped_pipe_us=core_only["overlapped_pipe_us"], **est)
    return out


def npu_gather_us(pos, slots, counts, host, dst_shape, partition: str, cores: int) -> float:
    """--device npu: the same launch on an NPU, reading a registered host pool, timed with
    torch.npu.Event after warm-up (median). Unverified: never run, no NPU was available."""
    pool = backend.alloc_host_pool(tuple(host.shape), host.dtype)
    pool.copy_(host)
    backend.register_host_pool(pool)
    try:
        dev = torch.device("npu")
        batch, capacity, row_bytes = dst_shape
        dst = kv_slots(batch * capacity, (row_bytes,), torch.uint8, dev).view(dst_shape)
        p, s, c = pos.to(dev), slots.to(dev), counts.to(dev)
        times = common.npu_time_us(lambda: torch.ops.avsg.gather(p, s, c, [pool], [dst], None, 0,
                                                                 partition, cores))
        return float(sorted(times)[len(times) // 2])
    finally:
        torch.npu.synchronize()
        backend.unregister_host_pool(pool)


def measure_cpu_bandwidth(row_bytes: int, k: int, batch: int = 8, repeats: int = 5) -> Dict:
    """This machine: fast-emulation gather (miss partition, blocks run one after another on the
    calling thread) and torch's index copy (one thread) against a plain single-threaded memcpy
    (``memmove``) of the same bytes; median of ``repeats``."""
    import ctypes
    w = workload(batch, 0.5, k, 99)
    host = torch.randint(0, 256, (batch, w["context"], row_bytes), dtype=torch.uint8)
    dst = kv_slots(batch * w["capacity"], (row_bytes,), torch.uint8).view(batch, w["capacity"], row_bytes)
    nbytes = int(w["counts"].sum()) * row_bytes
    flat_src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    flat_dst = torch.empty_like(flat_src)
    rr, jj = (w["miss_pos"] >= 0).nonzero(as_tuple=True)

    def timed(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times) / 1e9

    with backend.emulation("fast"):
        kernel = timed(lambda: torch.ops.avsg.gather(w["miss_pos"], w["miss_slots"], w["counts"],
                                                     [host], [dst], None, 0, "miss", 40))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        index = timed(lambda: dst.__setitem__((rr, w["miss_slots"][rr, jj].long()),
                                              host[rr, w["miss_pos"][rr, jj].long()]))
    finally:
        torch.set_num_threads(threads)
    memcpy = timed(lambda: ctypes.memmove(flat_dst.data_ptr(), flat_src.data_ptr(), nbytes))
    return dict(row_bytes=row_bytes, bytes=nbytes, rows=int(w["counts"].sum()),
                kernel_fast_emulation_gbps=kernel, torch_index_copy_gbps=index, memcpy_gbps=memcpy)


def plot(results: List[Dict], rows: List[int], batches, rates, path: str, link_gbps: float) -> None:
    """Bandwidth the cores could sustain (overlapped-pipe model with host DMA latency, no link
    bandwidth), against the link: where a curve is above the line, the link decides."""
    plt = common.pyplot()
    fig, axes = plt.subplots(len(rows), 2, figsize=(12, 4.4 * len(rows)), squeeze=False)
    colors = {"request": "tab:red", "selection": "tab:orange", "miss": "tab:blue", "topk": "tab:gray"}
    key = "cores_overlapped_pipe_gbps"
    for i, rb in enumerate(rows):
        sub = [r for r in results if r["row_bytes"] == rb]
        ax = axes[i][0]
        rate = max(rates)
        for _, p in PARTITIONS:
            pts = sorted((r["batch"], r["partitions"][p][key]) for r in sub if r["miss_rate"] == rate)
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", color=colors[p],
                    label=LABELS[p], linestyle="--" if p == "topk" else "-")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{rb} B rows, miss rate {rate:g}: bandwidth vs batch")
        ax.set_xlabel("batch (requests per launch)")
        ax = axes[i][1]
        for b, style in ((min(batches), "-"), (max(batches), "--")):
            for _, p in PARTITIONS[:3]:
                pts = sorted((r["miss_rate"], r["partitions"][p][key]) for r in sub if r["batch"] == b)
                ax.plot([a for a, _ in pts], [v for _, v in pts], marker="o", color=colors[p],
                        linestyle=style, label=f"{LABELS[p]}, batch {b}")
        ax.set_title(f"{rb} B rows: bandwidth vs miss rate")
        ax.set_xlabel("mean miss rate")
        for ax in axes[i]:
            ax.set_yscale("log")
            ax.axhline(link_gbps, color="k", lw=1.2, ls=":")
            ax.axhspan(link_gbps, ax.get_ylim()[1], color="0.85", alpha=0.5)
            ax.text(ax.get_xlim()[0], link_gbps * 1.05, f" host link {link_gbps:g} GB/s: above it the "
                    "link decides", fontsize=8, va="bottom")
            ax.set_ylabel("GB/s the cores could sustain\n(model: pipes + host DMA latency)")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7, loc="best", framealpha=0.9)
    fig.suptitle("avsg bench gather: modelled 910B gather (CPU emulation counted work, assumed "
                 "profile, overlapped-pipe with host DMA latency), not measured", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarise(results: List[Dict]) -> Dict:
    def ratios(key):
        s31 = [r["partitions"]["request"][key] / r["partitions"]["miss"][key] for r in results
               if r["partitions"]["miss"][key] > 0]
        s32 = [r["partitions"]["selection"][key] / r["partitions"]["miss"][key] for r in results
               if r["partitions"]["miss"][key] > 0]
        return max(s31), max(s32), min(s32)
    core = ratios("core_overlapped_pipe_us")
    latency = ratios("cores_overlapped_pipe_us")
    link = ratios("overlapped_pipe_us")
    link_decides = sum(r["partitions"]["miss"]["overlapped_pipe_decided_by"] == "link bandwidth"
                       for r in results)
    return {"max_S3_over_S1_core_only": core[0], "max_S3_over_S2_core_only": core[1],
            "min_S3_over_S2_core_only": core[2],
            "max_S3_over_S1_with_latency": latency[0], "max_S3_over_S2_with_latency": latency[1],
            "min_S3_over_S2_with_latency": latency[2],
            "max_S3_over_S1_with_link": link[0], "max_S3_over_S2_with_link": link[1],
            "configs_where_link_decides_S3": link_decides, "configs": len(results)}


def main(args: argparse.Namespace) -> int:
    batches = common.int_list("--batch", args.batch, high=1024)
    rates = common.float_list("--miss-rate", args.miss_rate, 0.0, 1.0)
    rows = common.int_list("--row-bytes", args.row_bytes, high=65536)
    common.at_least("--topk", args.topk)
    common.at_least("--cores", args.cores)
    if args.cores > 48:
        raise UsageError(f"--cores: expected at most 48 (a 910B has 40-48 AIV cores), got {args.cores}")
    hw = common.load_hw(args)
    if args.link_gbps is not None:
        if args.link_gbps <= 0:
            raise UsageError(f"--link-gbps: expected > 0, got {args.link_gbps}")
        hw.override("link_bytes_per_s", args.link_gbps * 1e9, "--link-gbps")
    if args.device == "npu":
        common.require_npu("gather")
    out = common.out_dir(args, "gather")
    link_gbps = hw["link_bytes_per_s"] / 1e9
    print(f"avsg bench gather: top-{args.topk} per request, {args.cores} emulated AIV cores, "
          f"hardware '{hw.name}' (link {link_gbps:g} GB/s, {hw['host_dma_latency_s'] * 1e6:g} us per "
          f"host DMA); {common.machine()}")
    print("  MODEL ESTIMATE from the CPU emulation's counted work, not a measurement: " + hw.status)
    results = []
    configs = [(rb, b, r) for rb in rows for b in batches for r in rates]
    progress = common.bar(len(configs), "gather", args)
    previous = backend.emulated_cores()
    backend.set_emulated_cores(max(previous, args.cores))
    host_cache: Dict = {}
    try:
        for rb, b, r in configs:
            results.append(run_config(b, r, rb, args, hw, host_cache))
            progress.update()
    finally:
        progress.close()
        backend.set_emulated_cores(previous)
    host_cache.clear()
    for rb in rows:
        print(f"\n  {rb} B rows; est. us = overlapped-pipe model with the link (serial-pipe in the JSON)")
        print(f"  {'batch':>5} {'miss':>5} {'rows':>7} | {'busiest core share: S1':>22} {'S2':>6} "
              f"{'S3':>6} | {'est. us S1':>10} {'S2':>8} {'S3':>8} | {'S3/S1':>6} {'S3/S2':>6} "
              f"{'(pipes only)':>13} | {'S3 GB/s':>7} {'decided by':>16}")
        for res in (x for x in results if x["row_bytes"] == rb):
            p = res["partitions"]
            s1, s2, s3 = p["request"], p["selection"], p["miss"]
            co = (s1["core_overlapped_pipe_us"] / s3["core_overlapped_pipe_us"],
                  s2["core_overlapped_pipe_us"] / s3["core_overlapped_pipe_us"])
            print(f"  {res['batch']:>5} {res['actual_miss_rate']:>5.2f} {res['misses']:>7,} | "
                  f"{s1['busiest_share']:>22.3f} {s2['busiest_share']:>6.3f} {s3['busiest_share']:>6.3f} | "
                  f"{s1['overlapped_pipe_us']:>10.1f} {s2['overlapped_pipe_us']:>8.1f} "
                  f"{s3['overlapped_pipe_us']:>8.1f} | "
                  f"{s1['overlapped_pipe_us'] / s3['overlapped_pipe_us']:>5.2f}x "
                  f"{s2['overlapped_pipe_us'] / s3['overlapped_pipe_us']:>5.2f}x "
                  f"{co[0]:>6.1f}/{co[1]:<5.2f}x | {s3['overlapped_pipe_gbps']:>7.1f} "
                  f"{s3['overlapped_pipe_decided_by']:>16}")
    summary = summarise(results)
    print(f"\n  S3 vs S1 / S2, best case over the grid: with the link {summary['max_S3_over_S1_with_link']:.2f}x"
          f" / {summary['max_S3_over_S2_with_link']:.2f}x; with host DMA latency, no link bandwidth "
          f"{summary['max_S3_over_S1_with_latency']:.2f}x / {summary['max_S3_over_S2_with_latency']:.2f}x "
          f"(worst S3/S2 {summary['min_S3_over_S2_with_latency']:.2f}x); pipes only "
          f"{summary['max_S3_over_S1_core_only']:.2f}x / {summary['max_S3_over_S2_core_only']:.2f}x "
          f"(worst case S3/S2 {summary['min_S3_over_S2_core_only']:.2f}x); "
          f"paper: up to {PAPER['S3/S1']}x / {PAPER['S3/S2']}x")
    print(f"  the link bandwidth decides S3 in {summary['configs_where_link_decides_S3']} of "
          f"{summary['configs']} configurations: there, no partition can do better than "
          f"{link_gbps:g} GB/s and balance stops mattering")
    print("  " + hardware.GATHER_LEAVES_OUT)
    cpu = measure_cpu_bandwidth(max(rows), args.topk)
    print(f"  this machine's CPU, same run ({cpu['rows']:,} rows of {cpu['row_bytes']} B): gather "
          f"kernel in the fast emulation {cpu['kernel_fast_emulation_gbps']:.1f} GB/s, torch advanced-index "
          f"copy {cpu['torch_index_copy_gbps']:.1f} GB/s, plain memcpy {cpu['memcpy_gbps']:.1f} GB/s")
    files = {"JSON": common.write_json(f"{out}/gather.json", dict(
        command="avsg bench gather", estimate=True, machine=common.machine(),
        hardware_name=hw.name, hardware=hw.sources(), cores=args.cores, topk=args.topk,
        partitions=LABELS, results=results, summary=summary, paper=PAPER, cpu_bandwidth=cpu,
        leaves_out=hardware.GATHER_LEAVES_OUT))}
    files["plot"] = common.save_plot(f"{out}/gather_bandwidth.png",
                                     lambda p: plot(results, rows, batches, rates, p, link_gbps))
    blocks = []
    for rb in rows:
        table = []
        for res in (x for x in results if x["row_bytes"] == rb and x["miss_rate"] in (min(rates), max(rates))):
            p = res["partitions"]
            s1, s2, s3 = p["request"], p["selection"], p["miss"]
            table.append([str(res["batch"]), f"{res['actual_miss_rate']:.2f}", f"{res['misses']:,}",
                          f"{s1['busiest_share']:.2f} / {s2['busiest_share']:.2f} / {s3['busiest_share']:.3f}",
                          f"{s1['core_overlapped_pipe_us'] / s3['core_overlapped_pipe_us']:.1f}x / "
                          f"{s2['core_overlapped_pipe_us'] / s3['core_overlapped_pipe_us']:.2f}x",
                          f"{s1['cores_overlapped_pipe_us'] / s3['cores_overlapped_pipe_us']:.1f}x / "
                          f"{s2['cores_overlapped_pipe_us'] / s3['cores_overlapped_pipe_us']:.2f}x",
                          f"{s1['overlapped_pipe_us']:.1f} / {s2['overlapped_pipe_us']:.1f} / "
                          f"{s3['overlapped_pipe_us']:.1f}",
                          f"{s1['overlapped_pipe_us'] / s3['overlapped_pipe_us']:.2f}x / "
                          f"{s2['overlapped_pipe_us'] / s3['overlapped_pipe_us']:.2f}x",
                          f"{s3['overlapped_pipe_gbps']:.1f}", s3["overlapped_pipe_decided_by"]])
        blocks.append(common.markdown_table(
            f"gather-{rb}", ["batch", "miss rate", "rows", "busiest core share S1 / S2 / S3",
                             "S1 / S2 over S3, pipes only", "+ host DMA latency",
                             "est. us S1 / S2 / S3 with the link", "+ link bandwidth", "S3 GB/s",
                             "decided by"], table, "rrrrrrrrrl"))
    blocks.append(common.markdown_table("gather-summary", ["", "ours (model)", "paper"], [
        ["S3 over S1, best case, pipes only", f"{summary['max_S3_over_S1_core_only']:.2f}x", f"{PAPER['S3/S1']}x"],
        ["S3 over S2, best / worst case, pipes only", f"{summary['max_S3_over_S2_core_only']:.2f}x / "
         f"{summary['min_S3_over_S2_core_only']:.2f}x", f"{PAPER['S3/S2']}x (best)"],
        ["S3 over S1, best case, + host DMA latency", f"{summary['max_S3_over_S1_with_latency']:.2f}x", "-"],
        ["S3 over S2, best / worst case, + host DMA latency",
         f"{summary['max_S3_over_S2_with_latency']:.2f}x / {summary['min_S3_over_S2_with_latency']:.2f}x", "-"],
        ["S3 over S1 / S2, best case, with a {:g} GB/s link".format(link_gbps),
         f"{summary['max_S3_over_S1_with_link']:.2f}x / {summary['max_S3_over_S2_with_link']:.2f}x", "-"],
        ["configurations where the link decides S3",
         f"{summary['configs_where_link_decides_S3']} of {summary['configs']}", "-"],
        [f"this CPU: gather kernel (fast emulation) / torch advanced-index copy / memcpy, {cpu['row_bytes']} B rows",
         f"{cpu['kernel_fast_emulation_gbps']:.1f} / {cpu['torch_index_copy_gbps']:.1f} / "
         f"{cpu['memcpy_gbps']:.1f} GB/s", "-"]], "lrr"))
    tables = common.write_tables(args.tables, common.invocation(args), blocks)
    if tables:
        files["tables"] = tables
    common.report_outputs(files)
    return 0
