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

from ..cli_util import (OneLineParser, UsageError, check_memory, check_writable, float_in, int_in,
                        output_path, read_trace)

__all__ = ["add_trace_commands", "build_parser", "main"]

DEFAULT_CAPACITIES = (4096, 8192, 16384)
MAX_CAPACITY = 1 << 24      # positions the op addresses; a larger buffer holds nothing more


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
    tr = read_trace("trace", args.trace, check_values=False)
    if getattr(args, "layers", None):
        tr = tr.subset(layers=_parse_index_list(args.layers, tr.layers))
    steps = getattr(args, "steps", None)
    if steps is not None:
        if steps > tr.steps:
            raise UsageError(f"--steps: the trace has {tr.steps} steps, asked for {steps}")
        tr = tr.subset(steps=slice(0, steps))
    if not getattr(args, "no_check", False):
        from .format import TraceFormatError, validate_trace
        try:        # the values of what is replayed, not of the layers and steps cut away
            validate_trace(tr)
        except TraceFormatError as e:
            raise UsageError(f"trace: {args.trace}: {e}") from None
    return tr


def _check_policies(tr, policies, capacities, args, queries: int) -> None:
    """Build every (policy, capacity) once before any replay, so that a value the library
    refuses (a capacity below Tq x K or above the op's 32768, --ways, a trace whose T is past
    2**24) is a usage error naming the option before the first result."""
    from .policies import make_policy
    # the policies keep a slot per position and row (int64): bound it before building one
    check_memory("--capacity", 16 * tr.layers * queries * (tr.T + 1 + max(capacities)),
                 f"the policies' state for T = {tr.T:,} positions and {max(capacities):,} slots")
    for cap in capacities:
        for name in policies:
            try:
                make_policy(name, tr.layers, cap, tr.k, queries, max_pos=tr.T, **_policy_opts(args))
            except ValueError as e:
                raise UsageError(_policy_error(str(e), name, tr)) from None
            except RuntimeError as e:
                raise UsageError(f"--policy {name}: {e}") from None


def _policy_error(message: str, policy: str, tr) -> str:
    name, _, rest = message.partition(":")
    if name == "max_context":
        return f"trace: its context T = {tr.T:,} is past what policy {policy} takes:{rest}"
    option = {"capacity": "--capacity", "ways": "--ways", "buckets": "--buckets",
              "bucket_width": "--bucket-width", "lifetime": "--lifetime"}.get(name, "--policy")
    return f"{option} (policy {policy}):{rest}" if rest else f"--policy {policy}: {message}"


def _replay_checked(args, fn, *a, **kw):
    """``fn(*a, **kw)``; with --no-check the values the validation would have refused
    (positions past T, unsorted rows) reach the policies, and what they raise is the file's
    fault, not a crash."""
    if not args.no_check:
        return fn(*a, **kw)
    try:
        return fn(*a, **kw)
    except (ValueError, IndexError) as e:
        raise UsageError(f"trace: a value of the trace is out of range ({e}); run without "
                         f"--no-check to find it") from None


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
    policies = args.policy or policy_names()
    avsg_note = None
    if any(p.startswith("avsg") for p in policies):
        why = _avsg_available()
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
    _check_policies(tr, policies, args.capacity, args, tr.queries)
    print(f"trace {args.trace}: {tr.summary()}")
    if avsg_note:
        print(avsg_note)
    hw = None
    if args.cost_every:
        from ..bench import common as bench_common
        hw = bench_common.load_hw(args)
    results = []
    for cap in args.capacity:
        for p in policies:
            r = _replay_checked(args, replay, tr, p, cap, count_first_step=args.count_first_step,
                                entry_bytes=args.entry_bytes, progress=args.progress,
                                **_policy_opts(args))
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
    if png:
        try:
            report.plot_hit_rates(results, png, title=f"{stem}: hit rate vs capacity")
            print(f"wrote {png}")
        except RuntimeError as e:
            print(f"note: plot skipped: {e}")
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
    from ..cli_util import check_dir_writable
    from .format import save_trace, smallest_sel_dtype
    from .synth import generate, measure_gamma, measure_recall
    need = args.k + args.steps + args.window
    if args.max_len < need:
        raise UsageError(f"--max-len: expected >= --k + --steps + --window = {need:,} (every step "
                         f"selects --k of the positions so far), got {args.max_len:,}")
    # the trace, its int64 copies while measured, and one position map per layer
    sel_bytes = args.layers * args.steps * args.k * smallest_sel_dtype(args.max_len, False).itemsize
    check_memory("--steps", sel_bytes + 16 * args.steps * args.k + 8 * args.max_len,
                 f"{args.layers:,} layers x {args.steps:,} steps x top-{args.k:,}")
    grid = [(g, m) for g in args.gamma for m in args.mu_hist]
    many = len(grid) > 1
    if many:
        check_dir_writable("out", args.out)
        paths = [os.path.join(args.out, f"synth_g{g}_m{m}.npz") for g, m in grid]
    else:
        paths = [args.out]
    paths = [output_path("out", p, ".npz") for p in paths]
    for (g, m), path in zip(grid, paths):
        t0 = time.perf_counter()
        tr = generate(steps=args.steps, layers=args.layers, k=args.k, max_len=args.max_len, gamma=g,
                      mu_hist=m, sigma=args.sigma, window=args.window, seed=args.seed)
        save_trace(path, tr)
        mg = measure_gamma(tr.sel).mean()
        rc = measure_recall(tr.sel, args.window)
        recall = (f"measured recall mean {np.nanmean(rc):.4f}, std {np.nanstd(rc):.4f}"
                  if np.isfinite(rc).any() else f"recall not measured: fewer than --window + 2 = "
                  f"{args.window + 2} steps")
        print(f"wrote {path}: gamma={g} (measured {mg:.4f}), mu_hist={m} ({recall}), "
              f"{tr.summary()} [{time.perf_counter() - t0:.1f}s]")
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
    if args.accept_mean > args.drafts:
        raise UsageError(f"--accept-mean: expected a mean of 0..--drafts = {args.drafts} accepted "
                         f"drafts per step, got {args.accept_mean:g}")
    json_path = output_path("--json", args.json)
    tr = _load(args)
    if tr.has_mtp_axis:
        raise UsageError("trace: expected sel [layers, steps, K] (one query per step) for an MTP "
                         "replay; this trace already has the MTP axis")
    if tr.steps < 1 + args.drafts:
        raise UsageError(f"--drafts: an iteration reads 1 + --drafts = {1 + args.drafts} steps, "
                         f"the trace has {tr.steps}")
    if args.policy.startswith("avsg"):
        why = _avsg_available()
        if why is not None:
            raise UsageError(f"--policy: policy 'avsg' needs avsg.SparseKVBuffer: {why}")
    _check_policies(tr, [args.policy], [args.capacity], args, 1 + args.drafts)
    res = _replay_checked(args, mtp_replay, tr, policy=args.policy, capacity=args.capacity,
                          drafts=args.drafts, accept_mean=args.accept_mean,
                          accept_model=args.accept_model, seed=args.seed,
                          modes=args.modes or MODES, count_first_step=args.count_first_step,
                          **_policy_opts(args))
    print(format_mtp(res))
    if json_path:
        report.write_json(json_path, res)
        print(f"wrote {json_path}")
    return 0


def _add_common_trace_args(p, with_policy_opts=True):
    p.add_argument("trace", help="trace .npz (format: docs/design.md §8)")
    # a layer *selection* (indices), unlike the layer *counts* --layers of demo and synth
    p.add_argument("--layer-select", dest="layers", metavar="INDICES",
                   help="layers to use, e.g. 0-3,7 (default: all)")
    p.add_argument("--steps", type=int_in(1, 1 << 24),
                   help="use only the first N steps, 1..16777216 (default: all)")
    p.add_argument("--no-check", action="store_true", help="skip the O(size) value validation")
    if with_policy_opts:
        p.add_argument("--count-first-step", action="store_true",
                       help="count step 0 too (default: it only warms the buffer)")
        p.add_argument("--lifetime", type=int_in(1, 255), default=16,
                       help="avsg-lifetime: lifetime L, 1..255 (default 16)")
        p.add_argument("--ways", type=int_in(1, 32768), default=16,
                       help="setassoc-fifo: ways per set, a divisor of the capacity, 1..32768 "
                            "(default 16)")
        p.add_argument("--buckets", type=int_in(1, 65536), default=64,
                       help="bucketed-lru: buckets, 1..65536 (default 64)")
        p.add_argument("--bucket-width", type=int_in(1, 1 << 20), default=1,
                       help="bucketed-lru: steps per bucket, 1..1048576 (default 1)")


def _fill(trace_sub):
    from .policies import policy_names
    from .replay import DEFAULT_ENTRY_BYTES
    from .mtp import MODES
    names = policy_names()

    p = trace_sub.add_parser("replay", help="replay buffer policies on a trace, report hit rates",
                             description="Replay policies x capacities on a trace; print a table, "
                                         "per-layer spread; write JSON and a PNG plot.")
    _add_common_trace_args(p)
    p.add_argument("--capacity", type=int_in(1, MAX_CAPACITY), nargs="+",
                   default=list(DEFAULT_CAPACITIES),
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
    p.add_argument("--cost-every", type=int_in(0, 1 << 20), default=32, metavar="N",
                   help="avsg policies: run every N-th step in the strict emulation and report the "
                        "modelled plan us per row-step, the link us of the misses and their sum at "
                        "batch 1 and 64, 0..1048576 (default 32; 0: off)")
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
    p.add_argument("--steps", type=int_in(1, 1 << 24), default=1024,
                   help="decode steps recorded, 1..16777216 (default 1024)")
    p.add_argument("--layers", type=int_in(1, 4096), default=1,
                   help="layers, independent draws, 1..4096 (default 1)")
    p.add_argument("--k", type=int_in(1, 1 << 24), default=2048,
                   help="selections per step, top-k, 1..16777216 (default 2048)")
    p.add_argument("--max-len", type=int_in(1, 1 << 24), default=16384,
                   help="context length at the last step, >= --k + --steps + --window and <= "
                        "16777216 (default 16384)")
    p.add_argument("--gamma", type=float_in(0, 1), nargs="+", default=[0.7],
                   help="adjacent-step similarity: share of a step's selections kept from the "
                        "previous step, in [0, 1]; several values make a grid (default 0.7)")
    p.add_argument("--mu-hist", type=float_in(0, 1), nargs="+", default=[0.7],
                   help="mean historical recall: share of the new selections drawn from the last "
                        "--window steps, in [0, 1]; several values make a grid (default 0.7)")
    p.add_argument("--sigma", type=float_in(0, 1), default=0.01,
                   help="standard deviation of the per-step recall, in [0, 1] (default 0.01)")
    p.add_argument("--window", type=int_in(1, 1 << 20), default=8,
                   help="history window in steps for the recall, 1..1048576 (default 8)")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help="random seed, >= 0 (default 0)")
    p.set_defaults(func=cmd_synth)

    p = trace_sub.add_parser("info", help="validate a trace and print its summary")
    _add_common_trace_args(p, with_policy_opts=False)
    p.add_argument("--stats", action="store_true", help="also measure gamma and historical recall")
    p.add_argument("--window", type=int_in(1, 1 << 20), default=8,
                   help="history window for --stats, 1..1048576 (default 8)")
    p.set_defaults(func=cmd_info)

    p = trace_sub.add_parser("mtp", help="MTP replay: shared vs separate vs cold-start buffers")
    _add_common_trace_args(p)
    p.add_argument("--policy", default="lru", choices=names, help="buffer policy (default lru)")
    p.add_argument("--capacity", type=int_in(1, MAX_CAPACITY), default=8192,
                   help="buffer entries per layer, (1 + --drafts) x K..16777216 (default 8192)")
    p.add_argument("--drafts", type=int_in(1, 16), default=3,
                   help="MTP draft tokens per step, 1..16 (default 3)")
    p.add_argument("--accept-mean", type=float_in(0, 16), default=1.44,
                   help="mean accepted drafts per step, 0..--drafts (<= 16; default 1.44)")
    p.add_argument("--accept-model", choices=("geometric", "fixed"), default="geometric",
                   help="how accepted drafts are drawn (default geometric)")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0,
                   help="acceptance seed, >= 0 (default 0)")
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
    from ..cli_util import INPUT_ERRORS, mark_leaves, report_error
    parser = build_parser()
    mark_leaves(parser)
    args = parser.parse_args(argv)
    options = vars(args).pop("_options", ())
    try:
        return int(args.func(args) or 0)
    except INPUT_ERRORS as e:
        return report_error(f"avsg trace {args.trace_command}", e, options)


if __name__ == "__main__":
    sys.exit(main())
