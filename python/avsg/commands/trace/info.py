"""``avsg trace info``: validate a trace and print its summary (``--stats``: gamma and recall).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import numpy as np

from ...cli_util import (UsageError, check_dir_writable, check_memory, check_writable, float_in,
                         int_in, output_path)
from . import common


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common_trace_args(p, with_policy_opts=False)
    p.add_argument("--stats", action="store_true", help="also measure gamma and historical recall")
    p.add_argument("--window", type=int_in(1, 1 << 20), default=8,
                   help="history window for --stats, 1..1048576 (default 8)")


def main(args: argparse.Namespace) -> int:
    from ...traces.synth import measure_gamma, measure_recall
    tr = common.load(args)
    print(f"{args.trace}: valid trace")
    print(f"  {tr.summary()}")
    print(f"  rule: {tr.rule}")
    if tr.extra:
        print(f"  extra keys: {sorted(tr.extra)}")
    if args.stats:
        # both measure a step against earlier ones: a step with no history has no figure
        if tr.steps < 2:
            raise UsageError(f"--stats: gamma and recall compare steps; the trace (after --steps) "
                             f"has {tr.steps} step")
        if tr.steps < args.window + 2:
            raise UsageError(f"--window: recall over a window of {args.window} steps needs at "
                             f"least {args.window + 2} steps; the trace (after --steps) has {tr.steps}")
        g = measure_gamma(tr.sel)
        r = measure_recall(tr.sel, args.window)
        print(f"  adjacent-step similarity gamma: mean {g.mean():.4f} (per layer min {g.mean(1).min():.4f}"
              f", max {g.mean(1).max():.4f})")
        if np.isnan(r).all():
            print(f"  historical recall (window {args.window}): none (no step selects a position "
                  f"the step before did not)")
        else:
            per_layer = np.array([np.nanmean(row) if not np.isnan(row).all() else np.nan for row in r])
            print(f"  historical recall (window {args.window}): mean {np.nanmean(r):.4f} "
                  f"(per layer min {np.nanmin(per_layer):.4f}, max {np.nanmax(per_layer):.4f})")
    return 0
