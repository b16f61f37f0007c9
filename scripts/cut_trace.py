#!/usr/bin/env python
"""Cut a small trace out of a large one: every ``--layer-step``-th layer and the first ``--steps``
decode steps, in the same format, with ``model``/``rule`` saying what it was cut from.

The package's embedded default trace (``python/avsg/lab/traces/data/asyncio_32k_8x256.npz``) is

    python scripts/cut_trace.py ../shared/traces/asyncio_32k.npz \
        python/avsg/lab/traces/data/asyncio_32k_8x256.npz --layer-step 3 --steps 256

A full-size trace comes from ``scripts/record_trace.py`` (a local Hugging Face model and a text).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # run from a source checkout too


def main(argv=None) -> int:
    from avsg.lab.traces.format import load_trace, save_trace
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", help="trace .npz to cut from")
    p.add_argument("out", help="trace .npz to write")
    p.add_argument("--layer-step", type=int, default=3, help="keep layers 0, n, 2n, ... (default 3)")
    p.add_argument("--steps", type=int, default=256, help="keep the first N steps (default 256)")
    args = p.parse_args(argv)
    if args.layer_step < 1 or args.steps < 1:
        p.error("--layer-step and --steps: expected >= 1")
    full = load_trace(args.source)
    if args.steps > full.steps:
        p.error(f"--steps: the trace has {full.steps} steps, asked for {args.steps}")
    layers = list(range(0, full.layers, args.layer_step))
    cut = full.subset(layers=layers, steps=slice(0, args.steps))
    name = os.path.basename(args.source)
    what = (f"cut from {name}: layers {','.join(map(str, layers))} of {full.layers}, decode steps "
            f"0..{args.steps - 1} of {full.steps} (positions {int(cut.positions[0])}.."
            f"{int(cut.positions[-1])})")
    cut.model = f"{full.model}; {what}"
    cut.rule = f"{full.rule}; {what}"
    save_trace(args.out, cut)
    print(f"{args.out}: {cut.summary()}, {os.path.getsize(args.out) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
