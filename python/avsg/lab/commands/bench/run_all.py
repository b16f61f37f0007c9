"""``avsg bench all``: every benchmark in turn, under one output directory, headline ratios last.

plan, gather, hash-buckets, emulation and decode, each into ``--out``/<command>/ (default
avsg-results/bench-all/). ``--quick`` runs reduced grids (under 2 minutes on a 2-core machine);
without it, each benchmark's full defaults (much longer). The last line summarises the headline
ratios: hash vs dual-pointer plan at S = K = 2048, S3 vs S1 / S2 gather, and AVSG vs offload TPOT.
A benchmark that needs the shared trace and cannot find it is skipped with a message.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from ....cli_util import UsageError, comma_list, run_command
from . import common

QUICK = {
    "plan": ["--steps", "3", "--warmup", "16"],
    "gather": ["--batch", "1,2,4,8,16,32", "--miss-rate", "0.25,0.5,1.0", "--row-bytes", "656,1152"],
    "hash-buckets": ["--layers", "8", "--steps", "64"],
    "emulation": ["--steps", "4", "--warmup", "1", "--rows", "2"],
    "decode": ["--trace-layers", "2", "--trace-steps", "128", "--batch", "1,8",
               "--context", "32768,131072", "--mtp", "0,3"],
}


NEEDS_TRACE = ("decode",)   # the others fall back to pre-filled buffers or synthetic selections


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="reduced grids: under 2 minutes on a 2-core machine")
    parser.add_argument("--only", default="plan,gather,hash-buckets,emulation,decode",
                        help="comma-separated benchmarks to run (default all five)")
    common.add_common_arguments(parser, "all")


def main(args: argparse.Namespace) -> int:
    only = comma_list("--only", args.only)
    bad = [b for b in only if b not in QUICK]
    if bad:
        raise UsageError(f"--only: expected names among {', '.join(QUICK)}, got {args.only!r}")
    common.load_hw(args)                 # a bad --hw is the user's mistake, not a skipped bench
    if args.device == "npu":
        common.require_npu("all")
    root = common.out_dir(args, "all")
    from ...traces.lookup import find_trace
    trace_missing = find_trace(None) is None
    hw_args = ["--hw", args.hw] if args.hw else []
    status, files, started = {}, {}, time.perf_counter()
    for name in only:
        out = os.path.join(root, name)
        argv = ["bench", name, *(QUICK[name] if args.quick else []), "--out", out]
        if name != "emulation" and name != "hash-buckets":
            argv += hw_args
        if name != "decode" and args.device != "cpu":
            argv += ["--device", args.device]
        if args.quiet:
            argv.append("--quiet")
        print(f"\n===== avsg {' '.join(argv)}", flush=True)
        t0 = time.perf_counter()
        rc = run_command(argv)
        status[name] = rc
        print(f"===== {name}: exit {rc}, {time.perf_counter() - t0:.0f} s", flush=True)
        files[name] = out
    # the headline quotes only what this run measured: benchmarks that ran now and succeeded
    # (a JSON left in --out by an earlier run is not this run's result)
    head = [line for name in only if status.get(name) == 0
            for line in [_headline(name, os.path.join(root, name))] if line]
    # skipped: a benchmark that needs the shared trace, when it is absent; any other non-zero
    # exit (a usage error included) is a failure
    skipped = [n for n, rc in status.items() if rc == 2 and trace_missing and n in NEEDS_TRACE]
    failed = [n for n, rc in status.items() if rc != 0 and n not in skipped]
    print(f"\nresults under {root}/ ({', '.join(files)}); {time.perf_counter() - started:.0f} s"
          + (f"; skipped (see its message): {', '.join(skipped)}" if skipped else "")
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    print("headline (modelled, CPU emulation; see each table): " + "; ".join(head or ["none"]))
    return 0 if not failed else 1


def _headline(name: str, out: str):
    """The headline ratio of benchmark ``name`` from the JSON it wrote under ``out``, or None."""
    try:
        if name == "plan":
            plan = json.load(open(os.path.join(out, "plan.json")))
            r = plan["anchors"]["pre-filled"]["dual/hash at S=K=2048"]
            return f"plan dual/hash at S=K=2048 {r:.2f}x (paper 2.80x)"
        if name == "gather":
            g = json.load(open(os.path.join(out, "gather.json")))["summary"]
            return (f"gather S3 over S1/S2 up to {g['max_S3_over_S1_core_only']:.1f}x/"
                    f"{g['max_S3_over_S2_core_only']:.2f}x pipes only, "
                    f"{g['max_S3_over_S1_with_link']:.2f}x/{g['max_S3_over_S2_with_link']:.2f}x "
                    f"with the link (paper 34.44x/3.48x)")
        if name == "decode":
            d = json.load(open(os.path.join(out, "decode.json")))["summary"]
            ratios = [x["bundled"]["tpot_ratio"] for x in d if x["bundled"].get("tpot_ratio")]
            return (f"decode avsg/best peer TPOT {min(ratios):.2f}-{max(ratios):.2f} (feasible "
                    f"rows; the paper's 0.61 is against a no-reuse baseline)")
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return None
