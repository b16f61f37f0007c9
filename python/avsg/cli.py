"""The ``avsg`` command: ``avsg demo`` (plan + gather on a trace) and ``avsg trace ...``."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def build_parser() -> argparse.ArgumentParser:
    from . import demo

    parser = argparse.ArgumentParser(prog="avsg", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo_parser = sub.add_parser("demo", help="plan + gather over decode steps of a trace")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.main)
    try:
        from .traces.cli import add_trace_commands
    except ImportError:
        pass
    else:
        add_trace_commands(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
