"""``avsg trace mtp``: MTP replay, one buffer shared by the query tokens vs one each vs cold start.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import numpy as np

from ....cli_util import (UsageError, check_dir_writable, check_memory, check_writable, float_in,
                         int_in, output_path, writing)
from . import common


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ...traces.policies import policy_names
    # belady is offline (it reads the whole future at the start); here the acceptance draws
    # the iterations as the replay goes, so it has no future to read
    names = [n for n in policy_names() if n != "belady"]
    from ...traces.mtp import MODES
    common.add_common_trace_args(p)
    p.add_argument("--policy", default="lru", choices=names,
                   help="buffer policy (default lru; not belady, an offline bound: see trace replay)")
    p.add_argument("--capacity", type=int_in(1, common.MAX_CAPACITY), default=8192,
                   help="buffer entries per layer, (1 + --drafts) x K..16777216 (default 8192)")
    p.add_argument("--drafts", type=int_in(1, 16), default=3,
                   help="MTP draft tokens per step, 1..16 (default 3)")
    p.add_argument("--accept-mean", type=float_in(0, 16), default=None,
                   help="mean accepted drafts per step, 0..--drafts (<= 16; default 0.48 x "
                        "--drafts: 1.44 at the default 3 drafts)")
    p.add_argument("--accept-model", choices=("geometric", "fixed"), default="geometric",
                   help="how accepted drafts are drawn (default geometric)")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0,
                   help="acceptance seed, >= 0 (default 0)")
    p.add_argument("--modes", nargs="+", choices=MODES, help="buffer sharing modes (default all)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")


def main(args: argparse.Namespace) -> int:
    from ...traces.mtp import MODES, format_mtp, mtp_replay
    from ...traces import report
    if args.accept_mean is None:      # the default acceptance rate, whatever the drafts
        args.accept_mean = 0.48 * args.drafts
    if args.accept_mean > args.drafts:
        raise UsageError(f"--accept-mean: expected a mean of 0..--drafts = {args.drafts} accepted "
                         f"drafts per step, got {args.accept_mean:g}")
    if args.modes and len(set(args.modes)) < len(args.modes):
        raise UsageError(f"--modes: {' '.join(args.modes)} names a mode twice")
    json_path = output_path("--json", args.json)
    tr = common.load(args)
    if tr.has_mtp_axis:
        raise UsageError("trace: expected sel [layers, steps, K] (one query per step) for an MTP "
                         "replay; this trace already has the MTP axis")
    if tr.steps < 1 + args.drafts:
        raise UsageError(f"--drafts: an iteration reads 1 + --drafts = {1 + args.drafts} steps, "
                         f"the trace has {tr.steps}")
    if args.policy.startswith("avsg"):
        why = common.avsg_available()
        if why is not None:
            raise UsageError(f"--policy: policy 'avsg' needs avsg.SparseKVBuffer: {why}")
    common.check_policies(tr, [args.policy], [args.capacity], args, 1 + args.drafts)
    res = common.replay_checked(args, mtp_replay, tr, policy=args.policy, capacity=args.capacity,
                          drafts=args.drafts, accept_mean=args.accept_mean,
                          accept_model=args.accept_model, seed=args.seed,
                          modes=args.modes or MODES, count_first_step=args.count_first_step,
                          **common.policy_opts(args))
    if res["iterations"] == 0:
        raise UsageError(f"--steps: {tr.steps} trace steps give no counted MTP iteration (an "
                         f"iteration reads 1 + --drafts = {1 + args.drafts} steps and the first "
                         f"only warms the buffers; pass more steps or --count-first-step)")
    print(format_mtp(res))
    if json_path:
        with writing("--json", json_path):
            report.write_json(json_path, res)
        print(f"wrote {json_path}")
    return 0
