"""What the ``avsg trace`` commands share: loading the trace a command names (cut to
``--layer-select`` / ``--steps``, values checked), building every policy once before a replay so a
refused value is a usage error, and the common options."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import List, Optional

import numpy as np

from ....cli_util import (UsageError, check_dir_writable, check_memory_total, check_writable,
                         float_in, int_in, output_path)
from ...traces.lookup import TRACE_HELP, read_trace

DEFAULT_CAPACITIES = (4096, 8192, 16384)
MAX_CAPACITY = 1 << 24      # positions the op addresses; a larger buffer holds nothing more


def parse_index_list(text: str, n: int) -> List[int]:
    """``0-3,7`` -> [0, 1, 2, 3, 7]: comma-separated indices and ascending ranges in [0, n)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not re.fullmatch(r"\d+(-\d+)?", part):
            where = f" in {text!r}" if part != text.strip() else ""
            raise UsageError(f"--layer-select: expected indices and ranges like 0-3,7, got "
                             f"{_short(part)!r}{_short(where)}")
        a, _, b = part.partition("-")
        first, last = int(a), int(b or a)
        if last < first:
            raise UsageError(f"--layer-select: range {part!r} runs backwards (write {last}-{first})")
        # bounds before expanding: 0-100000000 would build a list of 10**8 ints (and print it)
        if last >= n:
            raise UsageError(f"--layer-select: {'range' if b else 'index'} "
                             f"{_short(part)} is not in 0..{n - 1} (the trace has {n} layers)")
        out.extend(range(first, last + 1))
        if len(out) > n:        # each layer at most once, so more than n indices repeat one
            break
    seen, repeated = set(), []
    for i in out:
        if i in seen and i not in repeated:
            repeated.append(i)
        seen.add(i)
    if repeated:
        raise UsageError(f"--layer-select: layers {sorted(repeated)[:10]}"
                         f"{' ...' if len(repeated) > 10 else ''} listed more than once")
    return out


def _short(text: str, keep: int = 40) -> str:
    """``text`` cut for an error line (an option value may be megabytes long)."""
    return text if len(text) <= keep else text[:keep] + "..."


def load(args):
    """The trace the command names, cut to --layer-select / --steps; mistakes are UsageErrors."""
    tr = read_trace("trace", args.trace, check_values=False)
    if getattr(args, "layers", None):
        tr = tr.subset(layers=parse_index_list(args.layers, tr.layers))
    steps = getattr(args, "steps", None)
    if steps is not None:
        if steps > tr.steps:
            raise UsageError(f"--steps: the trace has {tr.steps} steps, asked for {steps}")
        tr = tr.subset(steps=slice(0, steps))
    if not getattr(args, "no_check", False):
        from ...traces.format import TraceFormatError, validate_trace
        try:        # the values of what is replayed, not of the layers and steps cut away
            validate_trace(tr)
        except TraceFormatError as e:
            raise UsageError(f"trace: {args.trace}: {e}") from None
    return tr


# (option, dest, the policies that read it): given with none of them, it would do nothing
POLICY_OPTIONS = (("--lifetime", "lifetime", ("avsg-lifetime", "lifetime-hand", "freq-lifetime")),
                  ("--ways", "ways", ("setassoc-fifo",)),
                  ("--buckets", "buckets", ("bucketed-lru",)),
                  ("--bucket-width", "bucket_width", ("bucketed-lru",)),
                  ("--cost-every", "cost_every", ("avsg", "avsg-lifetime", "avsg-lru")))


def check_policies(tr, policies, capacities, args, queries: int) -> None:
    """Build every (policy, capacity) once before any replay, so that a value the library
    refuses (a capacity below Tq x K or above the op's 32768, --ways, a trace whose T is past
    2**24) is a usage error naming the option before the first result."""
    from ...traces.policies import make_policy
    for option, dest, users in POLICY_OPTIONS:   # an option no chosen policy reads does nothing
        value = getattr(args, dest, None)
        if dest == "cost_every" and value == 0:   # "off" asks for nothing, so it holds anywhere
            continue
        if value is not None and not set(policies) & set(users):
            raise UsageError(f"{option}: read only by {', '.join(users)}; it does nothing for "
                             f"{' '.join(policies)}")
    # the policies keep a slot per position and row (int64): bound it before building one
    # (the error names whichever of the trace's context and --capacity takes the most)
    per_entry = 16 * tr.layers * queries
    check_memory_total([
        (f"trace: {args.trace}", per_entry * (tr.T + 1),
         f"the policies' state for its context of T = {tr.T:,} positions"),
        ("--capacity", per_entry * max(capacities), f"{max(capacities):,} slots")])
    for cap in capacities:
        for name in policies:
            try:
                make_policy(name, tr.layers, cap, tr.k, queries, max_pos=tr.T, **policy_opts(args))
            except ValueError as e:
                raise UsageError(policy_error(str(e), name, tr)) from None
            except RuntimeError as e:
                raise UsageError(f"--policy {name}: {e}") from None


def policy_error(message: str, policy: str, tr) -> str:
    name, _, rest = message.partition(":")
    if name == "max_context":
        return f"trace: its context T = {tr.T:,} is past what policy {policy} takes:{rest}"
    option = {"capacity": "--capacity", "ways": "--ways", "buckets": "--buckets",
              "bucket_width": "--bucket-width", "lifetime": "--lifetime"}.get(name, "--policy")
    return f"{option} (policy {policy}):{rest}" if rest else f"--policy {policy}: {message}"


def replay_checked(args, fn, *a, **kw):
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


def policy_opts(args):
    return {"lifetime": args.lifetime, "ways": args.ways, "buckets": args.buckets,
            "bucket_width": args.bucket_width, "cost_every": getattr(args, "cost_every", None)}


def avsg_available() -> Optional[str]:
    try:
        import avsg
        avsg.SparseKVBuffer
        return None
    except Exception as e:  # ImportError, AttributeError, library load errors
        return str(e)


def add_common_trace_args(p, with_policy_opts=True):
    p.add_argument("trace", help=f"{TRACE_HELP} (format: docs/design.md §8)")
    # a layer *selection* (indices), unlike the layer *counts* --layers of demo and synth
    p.add_argument("--layer-select", dest="layers", metavar="INDICES",
                   help="layers to use, e.g. 0-3,7 (default: all)")
    p.add_argument("--steps", type=int_in(1, 1 << 24),
                   help="use only the first N steps, 1..16777216 (default: all)")
    p.add_argument("--no-check", action="store_true", help="skip the O(size) value validation")
    if with_policy_opts:
        p.add_argument("--count-first-step", action="store_true",
                       help="count step 0 too (default: it only warms the buffer)")
        p.add_argument("--lifetime", type=int_in(1, 255),
                       help="avsg-lifetime, lifetime-hand, freq-lifetime: lifetime L, 1..255 "
                            "(default: the op's, reference.DEFAULT_LIFETIME, for the first two; 16 "
                            "for freq-lifetime)")
        p.add_argument("--ways", type=int_in(1, 32768),
                       help="setassoc-fifo: ways per set, a divisor of the capacity, 1..32768 "
                            "(default 16)")
        p.add_argument("--buckets", type=int_in(1, 65536),
                       help="bucketed-lru: buckets, 1..65536 (default 64)")
        p.add_argument("--bucket-width", type=int_in(1, 1 << 20),
                       help="bucketed-lru: steps per bucket, 1..1048576 (default 1)")
