"""``avsg trace synth``: synthetic traces with the AVSG paper's settings (adjacent-step similarity
gamma, historical recall mu); several values make a grid.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import numpy as np

from ....cli_util import (UsageError, check_dir_writable, check_memory, check_writable, float_in,
                         int_in, output_path, progress_bar, writing)
from . import common


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from ...traces.format import save_trace, smallest_sel_dtype
    from ...traces.synth import generate, measure_gamma, measure_recall
    need = args.k + args.steps + args.window
    if args.max_len < need:
        raise UsageError(f"--max-len: expected >= --k + --steps + --window = {need:,} (every step "
                         f"selects --k of the positions so far), got {args.max_len:,}")
    # the trace, its int64 copies while measured, and one position map per layer
    sel_bytes = args.layers * args.steps * args.k * smallest_sel_dtype(args.max_len, False).itemsize
    for option, values in (("--gamma", args.gamma), ("--mu-hist", args.mu_hist)):
        if len(set(values)) < len(values):   # two grid points would write one file
            raise UsageError(f"{option}: {' '.join(f'{v:g}' for v in values)} repeats a value")
    grid = [(g, m) for g in args.gamma for m in args.mu_hist]
    # every grid point is drawn before any is written: a point the context cannot hold is
    # refused with nothing left behind
    check_memory("--steps", len(grid) * sel_bytes + 16 * args.steps * args.k + 8 * args.max_len,
                 f"{len(grid)} x {args.layers:,} layers x {args.steps:,} steps x top-{args.k:,}")
    many = len(grid) > 1
    if many:
        if args.out.endswith(".npz") and not os.path.isdir(args.out):
            # a grid is one file per point in a directory: `synth s.npz --gamma 0.5 0.7` would
            # create a directory named s.npz
            grid_options = " ".join(f"{o} {' '.join(f'{v:g}' for v in vs)}" for o, vs in
                                    (("--gamma", args.gamma), ("--mu-hist", args.mu_hist))
                                    if len(vs) > 1)
            raise UsageError(f"out: {args.out} names a .npz file, but {grid_options} make a grid "
                             f"of {len(grid)} traces, written as files into a directory: give a "
                             f"directory (or one value each for one file)")
        check_dir_writable("out", args.out)
        paths = [os.path.join(args.out, f"synth_g{g}_m{m}.npz") for g, m in grid]
    else:
        paths = [args.out]
    paths = [output_path("out", p, ".npz") for p in paths]
    drawn = []
    show = not args.quiet and sys.stderr.isatty()
    # one unit per drawn step (warm-up included) of every layer and point, then one per point
    # written and measured: a large trace takes minutes, and the bar says how far it is
    per_point = args.layers * (args.steps + args.window + 1)
    bar = progress_bar(len(grid) * per_point, "drawing", "step", show)
    for g, m in grid:
        t0 = time.perf_counter()
        try:
            tr = generate(steps=args.steps, layers=args.layers, k=args.k, max_len=args.max_len,
                          gamma=g, mu_hist=m, sigma=args.sigma, window=args.window, seed=args.seed,
                          progress=bar.update)
        except ValueError as e:   # the context is too short for this point's fresh selections
            bar.close()
            raise UsageError(f"--max-len: {str(e).replace('max_len', '--max-len')} (nothing "
                             f"written)") from None
        drawn.append((tr, time.perf_counter() - t0))
    bar.close()
    bar = progress_bar(len(grid), "writing and measuring", "trace", show)
    for (g, m), path, (tr, seconds) in zip(grid, paths, drawn):
        with writing("out", path):
            save_trace(path, tr)
        mg = measure_gamma(tr.sel).mean()
        rc = measure_recall(tr.sel, args.window)
        bar.update(1)
        recall = (f"measured recall mean {np.nanmean(rc):.4f}, std {np.nanstd(rc):.4f}"
                  if np.isfinite(rc).any() else f"recall not measured: fewer than --window + 2 = "
                  f"{args.window + 2} steps")
        print(f"wrote {path}: gamma={g} (measured {mg:.4f}), mu_hist={m} ({recall}), "
              f"{tr.summary()} [{seconds:.1f}s]")
    bar.close()
    return 0
