"""``avsg bench calibrate``: microbenchmarks on an Ascend NPU that write a hardware profile.

NPU only, and UNVERIFIED: written from the CANN / torch_npu documentation, never run (no NPU was
available to this project). It times the gather kernel, one row per DMA, with torch.npu.Event:

* a DMA size sweep, 64 B to 64 KB rows, from HBM (a device-resident pool) and from mapped host
  memory (a pool from avsg.backend.alloc_host_pool, registered with register_host_pool), on one
  core (per-DMA latency: the time per row at the smallest size) and on every core (bandwidth:
  bytes per second at the largest size);
* the plan kernel at S = 8192, K = 2048 (the per-row step time bench decode reads).

It writes a profile JSON (``--out``, default avsg-results/bench-calibrate/profile.json) with the
measured entries replaced, each source saying so, and every other entry kept as the bundled
assumption; pass it to any benchmark with ``--hw``. Scalar-loop and Gather / Sort / GatherMask
throughput need dedicated AscendC microkernels that this repository does not have yet: those
constants stay assumptions, and the profile says so.
"""
from __future__ import annotations

import argparse
import datetime
import json
from typing import Dict, List

import torch

from .. import backend
from . import common, hardware

SIZES = [64 << i for i in range(11)]   # 64 B .. 64 KB
READS_IN_FLIGHT = 4                    # kGatherCopyBuffers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=4096, help="rows copied per timed launch (default 4096)")
    parser.add_argument("--iters", type=int, default=10, help="timed launches per point (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed launches per point (default 3)")
    parser.add_argument("--hw", metavar="JSON", default=hardware.DEFAULT_PROFILE,
                        help="profile whose unmeasured entries are kept (default the bundled 910B one)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help=f"directory for profile.json and the sweep (default {common.default_out('calibrate')}/)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _sweep(where: str, cores: int, args) -> List[Dict]:
    dev = torch.device("npu")
    out = []
    for size in SIZES:
        n = args.rows
        # every other host row: no two misses are contiguous, so each row is its own read
        if where == "host":
            src = backend.alloc_host_pool((1, 2 * n, size), torch.uint8)
            backend.register_host_pool(src)
        else:
            src = torch.empty((1, 2 * n, size), dtype=torch.uint8, device=dev)
        dst = torch.empty((1, n, size), dtype=torch.uint8, device=dev)
        pos = (2 * torch.arange(n, dtype=torch.int32, device=dev)).view(1, n)
        slots = torch.randperm(n, device="cpu").to(torch.int32).view(1, n).to(dev)  # no merged runs
        cnt = torch.tensor([n], dtype=torch.int32, device=dev)
        times = common.npu_time_us(lambda: torch.ops.avsg.gather(pos, slots, cnt, [src], [dst], None, 0,
                                                                 "miss", cores),
                                   args.warmup, args.iters)
        med = sorted(times)[len(times) // 2]
        out.append(dict(where=where, cores=cores, row_bytes=size, rows=n, us=med,
                        gbps=n * size / (med * 1e-6) / 1e9, us_per_row=med / n))
        if where == "host":
            backend.unregister_host_pool(src)
    return out


def main(args: argparse.Namespace) -> int:
    common.at_least("--rows", args.rows)
    common.at_least("--iters", args.iters)
    common.at_least("--warmup", args.warmup, 0)
    hw = common.load_hw(args)
    common.require_npu("calibrate")
    out = common.out_dir(args, "calibrate")
    cores = int(hw["aiv_cores"])
    sweep = []
    for where in ("hbm", "host"):
        for c in (1, cores):
            sweep += _sweep(where, c, args)
    one = {s["where"]: s for s in sweep if s["cores"] == 1 and s["row_bytes"] == SIZES[0]}
    full = {s["where"]: s for s in sweep if s["cores"] == cores and s["row_bytes"] == SIZES[-1]}
    stamp = f"calibrated by avsg bench calibrate on {torch.npu.get_device_name()} {datetime.date.today()}"
    prof = dict(hw.entries)
    prof["name"] = "calibrated"
    prof["status"] = f"{stamp}; unmeasured entries are the bundled assumptions"
    # one core keeps READS_IN_FLIGHT reads in flight (op_host/gather_tiling.h kGatherCopyBuffers)
    prof["host_dma_latency_s"] = {"value": one["host"]["us_per_row"] * 1e-6 * READS_IN_FLIGHT,
                                  "source": f"{stamp}: 64 B rows from mapped host memory, one core, "
                                            f"{READS_IN_FLIGHT} reads in flight"}
    prof["link_bytes_per_s"] = {"value": full["host"]["gbps"] * 1e9,
                                "source": f"{stamp}: 64 KB rows from mapped host memory, {cores} cores"}
    prof["hbm_bytes_per_s"] = {"value": full["hbm"]["gbps"] * 1e9,
                               "source": f"{stamp}: 64 KB rows from HBM, {cores} cores (read + write)"}
    prof["mte_bytes_per_cycle"] = {"value": full["hbm"]["gbps"] * 1e9 / cores / (hw["clock_ghz"] * 1e9),
                                   "source": f"{stamp}: HBM sweep per core"}
    for key in ("scalar_ub_cycles", "vec_cycles_per_repeat", "vec_issue_cycles"):
        prof[key] = dict(prof[key], source=prof[key]["source"] + "; NOT calibrated (no microkernel yet)")
    files = {"profile (pass with --hw)": common.write_json(f"{out}/profile.json", prof),
             "sweep JSON": common.write_json(f"{out}/dma_sweep.json", dict(sweep=sweep))}
    print(json.dumps({k: v for k, v in prof.items() if k in ("host_dma_latency_s", "link_bytes_per_s",
                                                              "hbm_bytes_per_s")}, indent=1))
    common.report_outputs(files)
    return 0
