"""``avsg trace info``: validate a trace and print its summary (``--stats``: gamma and recall).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import numpy as np

from ....cli_util import (UsageError, check_dir_writable, check_memory, check_writable, float_in,
                         int_in, output_path)
from . import common

DEFAULT_WINDOW = 8   # steps of history for the recall


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common_trace_args(p, with_policy_opts=False)
    p.add_argument("--stats", action="store_true", help="also measure gamma and historical recall")
    p.add_argument("--window", type=int_in(1, 1 << 20), default=None,
                   help=f"history window for --stats, 1..1048576 (default {DEFAULT_WINDOW})")


def main(args: argparse.Namespace) -> int:
    from ...traces.synth import measure_gamma, measure_recall
    tr = common.load(args)
    window = DEFAULT_WINDOW if args.window is None else args.window
    if args.stats:
        # both measure a step against earlier ones: a step with no history has no figure
        if tr.steps < 2:
            raise UsageError(f"--stats: gamma and recall compare steps; the trace (after --steps) "
                             f"has {tr.steps} step")
        if args.window is not None and tr.steps < window + 2:
            raise UsageError(f"--window: recall over a window of {window} steps needs at least "
                             f"{window + 2} steps; the trace (after --steps) has {tr.steps}")
    print(f"{args.trace}: valid trace")
    print(f"  {tr.summary()}")
    print(f"  rule: {tr.rule}")
    if tr.extra:
        print(f"  extra keys: {sorted(tr.extra)}")
    if args.stats:
        g = measure_gamma(tr.sel)
        r = measure_recall(tr.sel, window) if tr.steps >= window + 2 else None
        print(f"  adjacent-step similarity gamma: mean {g.mean():.4f} (per layer min {g.mean(1).min():.4f}"
              f", max {g.mean(1).max():.4f})")
        if r is None:      # the default window on a short trace: gamma only
            print(f"  historical recall (window {window}): not measured, fewer than --window + 2 = "
                  f"{window + 2} steps")
        elif np.isnan(r).all():
            print(f"  historical recall (window {window}): none (no step selects a position "
                  f"the step before did not)")
        else:
            per_layer = np.array([np.nanmean(row) if not np.isnan(row).all() else np.nan for row in r])
            print(f"  historical recall (window {window}): mean {np.nanmean(r):.4f} "
                  f"(per layer min {np.nanmin(per_layer):.4f}, max {np.nanmax(per_layer):.4f})")
    return 0
