"""``avsg trace replay``: replay buffer policies x capacities on a trace; hit rates against
Belady, the per-layer spread, and (avsg policies) the modelled step cost; JSON, a PNG plot, and
the gap table docs/hit_rate.md cites.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import numpy as np

from ....cli_util import (UsageError, check_dir_writable, check_memory, check_writable, float_in,
                         int_in, output_path, reject_together, write_text, writing)
from . import common

# a strict (counted) plan step costs about 25 fast ones on CPU: one in 32 keeps a costed replay
# within about twice the time of a plain one
DEFAULT_COST_EVERY = 32


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ...traces.policies import policy_names
    names = policy_names()
    from ...traces.replay import DEFAULT_ENTRY_BYTES
    common.add_common_trace_args(p)
    p.add_argument("--capacity", type=int_in(1, common.MAX_CAPACITY), nargs="+",
                   default=list(common.DEFAULT_CAPACITIES),
                   help="buffer entries per layer, Tq x K..16777216 (avsg policies: <= 32768; "
                        "default 4096 8192 16384)")
    p.add_argument("--policy", nargs="+", choices=names, help="policies (default: all)")
    p.add_argument("--entry-bytes", type=int_in(1, 1 << 20), default=DEFAULT_ENTRY_BYTES,
                   help=f"bytes per KV entry per layer, 1..1048576 (default {DEFAULT_ENTRY_BYTES}: "
                        f"MLA 576 x bf16)")
    p.add_argument("--out", default=os.path.join("avsg-results", "trace-replay"),
                   help="directory for JSON/PNG (default avsg-results/trace-replay/)")
    p.add_argument("--json", help="JSON path (default OUT/<trace>_replay.json)")
    p.add_argument("--plot", help="PNG path (default OUT/<trace>_replay.png)")
    p.add_argument("--no-plot", action="store_true", help="skip the hit-rate plot")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table")
    p.add_argument("--tables", metavar="PATH",
                   help="also write the default policy's gap table (lru, avsg and belady needed) "
                        "to PATH, for docs/hit_rate.md (scripts/update_readme_tables.py)")
    p.add_argument("--progress", action="store_true", default=None,
                   help="progress bar per replay (default: on when stderr is a terminal)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--cost-every", type=int_in(0, 1 << 20), default=None, metavar="N",
                   help="avsg policies: run every N-th step in the strict emulation and report the "
                        "modelled plan us per row-step, the link us of the misses and their sum at "
                        f"batch 1 and 64, 0..1048576 (default {DEFAULT_COST_EVERY}; 0: off)")
    from ...costmodel import hardware as _hardware
    p.add_argument("--hw", metavar="JSON", default=_hardware.DEFAULT_PROFILE,
                   help="hardware profile of the step-cost model (default: the bundled, "
                        "uncalibrated 910B assumptions)")


def main(args: argparse.Namespace) -> int:
    from ...traces.policies import policy_names
    from ...traces.replay import replay
    from ...traces import report
    t_all = time.perf_counter()
    reject_together(args, "--progress", "--quiet")
    reject_together(args, "--plot", "--no-plot")
    tr = common.load(args)
    policies = args.policy or policy_names()
    avsg_note = None
    if any(p.startswith("avsg") for p in policies):
        why = common.avsg_available()
        if why is not None:
            if args.policy:
                raise UsageError(f"--policy: policy 'avsg' needs avsg.SparseKVBuffer: {why}")
            avsg_note = f"note: skipping policy 'avsg' (avsg.SparseKVBuffer not importable: {why})"
            policies = [p for p in policies if not p.startswith("avsg")]
    check_writable("--tables", args.tables)
    stem = os.path.splitext(os.path.basename(args.trace))[0]
    json_path = output_path("--json" if args.json else "--out",
                            args.json or os.path.join(args.out, f"{stem}_replay.json"))
    png = None
    if not args.no_plot:
        png = output_path("--plot" if args.plot else "--out",
                          args.plot or os.path.join(args.out, f"{stem}_replay.png"),
                          "" if os.path.splitext(args.plot or ".png")[1] else ".png")
    if args.tables and not {"lru", "avsg", "belady"} <= set(policies):
        raise UsageError("--tables: the gap table needs the policies lru, avsg and belady "
                         f"(got {' '.join(policies)})")
    if args.progress is None:
        args.progress = sys.stderr.isatty()
    if args.quiet:
        args.progress = False
    common.check_policies(tr, policies, args.capacity, args, tr.queries)
    if args.cost_every is None:       # (given with no avsg policy, check_policies refused it)
        args.cost_every = DEFAULT_COST_EVERY
    if tr.steps < 2 and not args.count_first_step:
        raise UsageError(f"--steps: {tr.steps} step counts nothing (step 0 warms the buffers); "
                         f"replay at least 2 steps, or pass --count-first-step")
    print(f"trace {args.trace}: {tr.summary()}")
    if avsg_note:
        print(avsg_note)
    hw = None
    if args.cost_every:
        from ..bench import common as bench_common
        from ...costmodel.plan_cost import replay_step_cost
        hw = bench_common.load_hw(args)
    results = []
    for cap in args.capacity:
        for p in policies:
            r = common.replay_checked(args, replay, tr, p, cap, count_first_step=args.count_first_step,
                                entry_bytes=args.entry_bytes, progress=args.progress,
                                **common.policy_opts(args))
            extra = f", bypassed {r.bypassed}" if r.bypassed else ""
            print(f"  {r.description:<34s} C={cap:<6d} hit {100 * r.hit_rate:6.2f}%  "
                  f"elapsed {r.elapsed:6.1f}s{extra}", flush=True)
            results.append(r)
    print()
    print(f"hit rate per policy and capacity ({'all steps' if args.count_first_step else 'step 0 warms'}"
          f"; MB/step = fetched entries x {args.entry_bytes} B, summed over {tr.layers} layers; "
          f"%Bel = hits as % of Belady's; s = replay seconds)")
    print(report.results_table(results))
    print()
    print("per-layer spread")
    print(report.layer_spread_table(results))
    costs = {(r.policy, r.capacity): replay_step_cost(r, hw) for r in results} if hw is not None else {}
    if any(costs.values()):
        print()
        print(f"modelled step cost per layer (MODEL ESTIMATE from the strict emulation's counted "
              f"work, hardware '{hw.name}'; plan sampled every {args.cost_every} steps, one row per "
              f"core; link = misses x {args.entry_bytes} B at {hw['link_bytes_per_s'] / 1e9:g} GB/s)")
        print(report.cost_table(results, costs))
    info = {"path": os.path.abspath(args.trace), "layers": tr.layers, "steps": tr.steps,
            "queries": tr.queries, "k": tr.k, "T": tr.T, "model": tr.model, "rule": tr.rule}
    settings = {"capacities": list(args.capacity), "policies": policies,
                "count_first_step": args.count_first_step, "entry_bytes": args.entry_bytes,
                **common.policy_opts(args), "argv": sys.argv}
    built = report.build_report(results, info, settings)
    for d, r in zip(built["results"], results):
        d["step_cost"] = costs.get((r.policy, r.capacity))
    with writing("--json" if args.json else "--out", json_path):
        report.write_json(json_path, built)
    print(f"\nwrote {json_path}")
    if png:
        try:
            with writing("--plot" if args.plot else "--out", png):
                report.plot_hit_rates(results, png, title=f"{stem}: hit rate vs capacity")
            print(f"wrote {png}")
        except RuntimeError as e:
            print(f"note: plot skipped: {e}")
    if args.markdown:
        print()
        print(report.markdown_table(results))
    if args.tables:
        table = report.gap_table(results, f"hit-rate-{stem}")
        write_text("--tables", args.tables, f"`{' '.join(['avsg'] + sys.argv[1:])}`\n\n{table}")
        print(f"\nwrote {args.tables}")
    print(f"total elapsed {time.perf_counter() - t_all:.1f}s")
    return 0
