"""``avsg trace ...`` command line: ``replay``, ``synth``, ``info``, ``mtp``.

The package CLI calls :func:`add_trace_commands` on its subparsers; every leaf parser sets
``func`` (``args.func(args) -> int`` exit code). Stand-alone: ``python -m avsg.traces.cli replay ...``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import numpy as np

from ..cli_util import OneLineParser, UsageError, check_writable

__all__ = ["add_trace_commands", "build_parser", "main"]

DEFAULT_CAPACITIES = (4096, 8192, 16384)


def _parse_index_list(text: str, n: int) -> List[int]:
    out = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise UsageError(f"--layer-select: expected indices and ranges like 0-3,7, got {text!r}") \
            from None
    bad = [i for i in out if not 0 <= i < n]
    if bad or not out:
        raise UsageError(f"--layer-select: indices {bad or text!r} not in [0, {n}) (the trace "
                         f"has {n} layers)")
    return out


def _load(args):
    """The trace the command names, cut to --layer-select / --steps; mistakes are UsageErrors."""
    from .format import TraceFormatError, load_trace
    if not os.path.exists(args.trace):
        raise UsageError(f"trace: no such file: {args.trace}")
    try:
        tr = load_trace(args.trace, check_values=not getattr(args, "no_check", False))
    except TraceFormatError as e:
        raise UsageError(f"trace: {args.trace}: {e}") from None
    except (OSError, ValueError, KeyError, EOFError) as e:
        raise UsageError(f"trace: {args.trace} is not a readable .npz trace ({e})") from None
    if getattr(args, "layers", None):
        tr = tr.subset(layers=_parse_index_list(args.layers, tr.layers))
    steps = getattr(args, "steps", None)
    if steps is not None:
        if steps < 1:
            raise UsageError(f"--steps: expected >= 1, got {steps}")
        if steps > tr.steps:
            raise UsageError(f"--steps: the trace has {tr.steps} steps, asked for {steps}")
        tr = tr.subset(steps=slice(0, steps))
    return tr


def _policy_opts(args):
    return {"lifetime": args.lifetime, "ways": args.ways, "buckets": args.buckets,
            "bucket_width": args.bucket_width, "cost_every": getattr(args, "cost_every", None)}


def _avsg_available() -> Optional[str]:
    try:
        import avsg
        avsg.SparseKVBuffer
        return None
    except Exception as e:  # ImportError, AttributeError, library load errors
        return str(e)


def cmd_replay(args) -> int:
    from .policies import policy_names
    from .replay import replay
    from . import report
    t_all = time.perf_counter()
    tr = _load(args)
    print(f"trace {args.trace}: {tr.summary()}")
    policies = args.policy or policy_names()
    if any(p.startswith("avsg") for p in policies):
        why = _avsg_available()
        if why is not None:
            if args.policy:
                print(f"error: policy 'avsg' needs avsg.SparseKVBuffer: {why}", file=sys.stderr)
                return 2
            print(f"note: skipping policy 'avsg' (avsg.SparseKVBuffer not importable: {why})")
            policies = [p for p in policies if not p.startswith("avsg")]
    check_writable("--tables", args.tables)
    check_writable("--json", args.json)
    if args.tables and not {"lru", "avsg", "belady"} <= set(policies):
        raise UsageError("--tables: the gap table needs the policies lru, avsg and belady "
                         f"(got {' '.join(policies)})")
    if args.progress is None:
        args.progress = sys.stderr.isatty()
    if args.quiet:
        args.progress = False
    for cap in args.capacity:
        if cap < 1:
            raise UsageError(f"--capacity: expected >= 1, got {cap}")
    if args.cost_every < 0:
        raise UsageError(f"--cost-every: expected >= 0 (0: off), got {args.cost_every}")
    hw = None
    if args.cost_every:
        from ..bench import common as bench_common
        hw = bench_common.load_hw(args)
    results = []
    for cap in args.capacity:
        for p in policies:
            r = replay(tr, p, cap, count_first_step=args.count_first_step,
                       entry_bytes=args.entry_bytes, progress=args.progress, **_policy_opts(args))
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
    costs = {(r.policy, r.capacity): r.step_cost(hw) for r in results} if hw is not None else {}
    if any(costs.values()):
        print()
        print(f"modelled step cost per layer (MODEL ESTIMATE from the strict emulation's counted "
              f"work, hardware '{hw.name}'; plan sampled every {args.cost_every} steps, one row per "
              f"core; link = misses x {args.entry_bytes} B at {hw['link_bytes_per_s'] / 1e9:g} GB/s)")
        print(report.cost_table(results, costs))
    stem = os.path.splitext(os.path.basename(args.trace))[0]
    json_path = args.json or os.path.join(args.out, f"{stem}_replay.json")
    info = {"path": os.path.abspath(args.trace), "layers": tr.layers, "steps": tr.steps,
            "queries": tr.queries, "k": tr.k, "T": tr.T, "model": tr.model, "rule": tr.rule}
    settings = {"capacities": list(args.capacity), "policies": policies,
                "count_first_step": args.count_first_step, "entry_bytes": args.entry_bytes,
                **_policy_opts(args), "argv": sys.argv}
    built = report.build_report(results, info, settings)
    for d, r in zip(built["results"], results):
        d["step_cost"] = costs.get((r.policy, r.capacity))
    report.write_json(json_path, built)
    print(f"\nwrote {json_path}")
    if not args.no_plot:
        png = args.plot or os.path.join(args.out, f"{stem}_replay.png")
        try:
            report.plot_hit_rates(results, png, title=f"{stem}: hit rate vs capacity")
            print(f"wrote {png}")
        except RuntimeError as e:
            print(f"note: no plot: {e}")
    if args.markdown:
        print()
        print(report.markdown_table(results))
    if args.tables:
        table = report.gap_table(results, f"hit-rate-{stem}")
        with open(args.tables, "w") as f:
            f.write(f"`{' '.join(['avsg'] + sys.argv[1:])}`\n\n{table}")
        print(f"\nwrote {args.tables}")
    print(f"total elapsed {time.perf_counter() - t_all:.1f}s")
    return 0


def cmd_synth(args) -> int:
    from .format import save_trace
    from .synth import generate, measure_gamma, measure_recall
    grid = [(g, m) for g in args.gamma for m in args.mu_hist]
    many = len(grid) > 1
    if many:
        os.makedirs(args.out, exist_ok=True)
    for g, m in grid:
        t0 = time.perf_counter()
        tr = generate(steps=args.steps, layers=args.layers, k=args.k, max_len=args.max_len, gamma=g,
                      mu_hist=m, sigma=args.sigma, window=args.window, seed=args.seed)
        path = os.path.join(args.out, f"synth_g{g}_m{m}.npz") if many else args.out
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        save_trace(path, tr)
        if not path.endswith(".npz"):
            path += ".npz"
        mg = measure_gamma(tr.sel).mean()
        rc = measure_recall(tr.sel, args.window)
        print(f"wrote {path}: gamma={g} (measured {mg:.4f}), mu_hist={m} (measured recall mean "
              f"{np.nanmean(rc):.4f}, std {np.nanstd(rc):.4f}), {tr.summary()} "
              f"[{time.perf_counter() - t0:.1f}s]")
    return 0


def cmd_info(args) -> int:
    from .synth import measure_gamma, measure_recall
    tr = _load(args)
    print(f"{args.trace}: valid trace")
    print(f"  {tr.summary()}")
    print(f"  rule: {tr.rule}")
    if tr.extra:
        print(f"  extra keys: {sorted(tr.extra)}")
    if args.stats:
        g = measure_gamma(tr.sel)
        r = measure_recall(tr.sel, args.window)
        print(f"  adjacent-step similarity gamma: mean {g.mean():.4f} (per layer min {g.mean(1).min():.4f}"
              f", max {g.mean(1).max():.4f})")
        print(f"  historical recall (window {args.window}): mean {np.nanmean(r):.4f} "
              f"(per layer min {np.nanmin(np.nanmean(r, 1)):.4f}, max {np.nanmax(np.nanmean(r, 1)):.4f})")
    return 0


def cmd_mtp(args) -> int:
    from .mtp import MODES, format_mtp, mtp_replay
    from . import report
    tr = _load(args)
    if args.policy.startswith("avsg"):
        why = _avsg_available()
        if why is not None:
            print(f"error: policy 'avsg' needs avsg.SparseKVBuffer: {why}", file=sys.stderr)
            return 2
    res = mtp_replay(tr, policy=args.policy, capacity=args.capacity, drafts=args.drafts,
                     accept_mean=args.accept_mean, accept_model=args.accept_model, seed=args.seed,
                     modes=args.modes or MODES, count_first_step=args.count_first_step,
                     **_policy_opts(args))
    print(format_mtp(res))
    if args.json:
        report.write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _add_common_trace_args(p, with_policy_opts=True):
    p.add_argument("trace", help="trace .npz (format: docs/design.md §8)")
    # a layer *selection* (indices), unlike the layer *counts* --layers of demo and synth
    p.add_argument("--layer-select", dest="layers", metavar="INDICES",
                   help="layers to use, e.g. 0-3,7 (default: all)")
    p.add_argument("--steps", type=int, help="use only the first N steps (default: all)")
    p.add_argument("--no-check", action="store_true", help="skip the O(size) value validation")
    if with_policy_opts:
        p.add_argument("--count-first-step", action="store_true",
                       help="count step 0 too (default: it only warms the buffer)")
        p.add_argument("--lifetime", type=int, default=16, help="avsg: lifetime L (default 16)")
        p.add_argument("--ways", type=int, default=16, help="setassoc-fifo: ways per set (default 16)")
        p.add_argument("--buckets", type=int, default=64, help="bucketed-lru: buckets (default 64)")
        p.add_argument("--bucket-width", type=int, default=1,
                       help="bucketed-lru: steps per bucket (default 1)")


def _fill(trace_sub):
    from .policies import policy_names
    from .replay import DEFAULT_ENTRY_BYTES
    from .mtp import MODES
    names = policy_names()

    p = trace_sub.add_parser("replay", help="replay buffer policies on a trace, report hit rates",
                             description="Replay policies x capacities on a trace; print a table, "
                                         "per-layer spread; write JSON and a PNG plot.")
    _add_common_trace_args(p)
    p.add_argument("--capacity", type=int, nargs="+", default=list(DEFAULT_CAPACITIES),
                   help="buffer entries per layer (default 4096 8192 16384)")
    p.add_argument("--policy", nargs="+", choices=names, help="policies (default: all)")
    p.add_argument("--entry-bytes", type=int, default=DEFAULT_ENTRY_BYTES,
                   help=f"bytes per KV entry per layer (default {DEFAULT_ENTRY_BYTES}: MLA 576 x bf16)")
    p.add_argument("--out", default=os.path.join("avsg-results", "trace-replay"),
                   help="directory for JSON/PNG (default avsg-results/trace-replay/)")
    p.add_argument("--json", help="JSON path (default OUT/<trace>_replay.json)")
    p.add_argument("--plot", help="PNG path (default OUT/<trace>_replay.png)")
    p.add_argument("--no-plot", action="store_true", help="skip the hit-rate plot")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table")
    p.add_argument("--tables", metavar="PATH",
                   help="also write the default policy's gap table (lru, avsg and belady needed) "
                        "to PATH, for README (scripts/update_readme_tables.py)")
    p.add_argument("--progress", action="store_true", default=None,
                   help="progress bar per replay (default: on when stderr is a terminal)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--cost-every", type=int, default=32, metavar="N",
                   help="avsg policies: run every N-th step in the strict emulation and report the "
                        "modelled plan us per row-step, the link us of the misses and their sum at "
                        "batch 1 and 64 (default 32; 0: off)")
    from ..bench import hardware as _hardware
    p.add_argument("--hw", metavar="JSON", default=_hardware.DEFAULT_PROFILE,
                   help="hardware profile of the step-cost model (default: the bundled, "
                        "uncalibrated 910B assumptions)")
    p.set_defaults(func=cmd_replay)

    p = trace_sub.add_parser("synth", help="write synthetic traces (AVSG paper settings)",
                             description="Synthetic traces; see avsg.traces.synth for the exact "
                                         "definitions of gamma and historical recall. With several "
                                         "gamma/mu values OUT is a directory.")
    p.add_argument("out", help="output .npz (or directory for a grid)")
    p.add_argument("--steps", type=int, default=1024, help="decode steps recorded (default 1024)")
    p.add_argument("--layers", type=int, default=1, help="layers, independent draws (default 1)")
    p.add_argument("--k", type=int, default=2048, help="selections per step, top-k (default 2048)")
    p.add_argument("--max-len", type=int, default=16384,
                   help="context length at the last step (default 16384)")
    p.add_argument("--gamma", type=float, nargs="+", default=[0.7],
                   help="adjacent-step similarity: share of a step's selections kept from the "
                        "previous step, in [0, 1]; several values make a grid (default 0.7)")
    p.add_argument("--mu-hist", type=float, nargs="+", default=[0.7],
                   help="mean historical recall: share of the new selections drawn from the last "
                        "--window steps, in [0, 1]; several values make a grid (default 0.7)")
    p.add_argument("--sigma", type=float, default=0.01,
                   help="standard deviation of the per-step recall (default 0.01)")
    p.add_argument("--window", type=int, default=8,
                   help="history window in steps for the recall (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.set_defaults(func=cmd_synth)

    p = trace_sub.add_parser("info", help="validate a trace and print its summary")
    _add_common_trace_args(p, with_policy_opts=False)
    p.add_argument("--stats", action="store_true", help="also measure gamma and historical recall")
    p.add_argument("--window", type=int, default=8, help="history window for --stats (default 8)")
    p.set_defaults(func=cmd_info)

    p = trace_sub.add_parser("mtp", help="MTP replay: shared vs separate vs cold-start buffers")
    _add_common_trace_args(p)
    p.add_argument("--policy", default="lru", choices=names, help="buffer policy (default lru)")
    p.add_argument("--capacity", type=int, default=8192, help="buffer entries per layer (default 8192)")
    p.add_argument("--drafts", type=int, default=3, help="MTP draft tokens per step (default 3)")
    p.add_argument("--accept-mean", type=float, default=1.44,
                   help="mean accepted drafts per step (default 1.44)")
    p.add_argument("--accept-model", choices=("geometric", "fixed"), default="geometric",
                   help="how accepted drafts are drawn (default geometric)")
    p.add_argument("--seed", type=int, default=0, help="acceptance seed (default 0)")
    p.add_argument("--modes", nargs="+", choices=MODES, help="buffer sharing modes (default all)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    p.set_defaults(func=cmd_mtp)


def add_trace_commands(subparsers) -> None:
    """Add ``trace {replay,synth,info,mtp}`` to an argparse ``subparsers`` object."""
    p = subparsers.add_parser("trace", help="selection traces: replay policies, synthesize, inspect",
                              description="Selection traces and buffer-policy replay.")
    sub = p.add_subparsers(dest="trace_command", metavar="{replay,synth,info,mtp}",
                           parser_class=OneLineParser)
    sub.required = True
    _fill(sub)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m avsg.traces.cli",
                      description="Selection traces and buffer-policy replay.")
    sub = p.add_subparsers(dest="trace_command", metavar="{replay,synth,info,mtp}",
                           parser_class=OneLineParser)
    sub.required = True
    _fill(sub)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"avsg trace {args.trace_command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
