"""The ``avsg`` command.

    avsg run        the decode runtime in offload / avsg / device modes, side by side
    avsg generate   greedy generation from a checkpoint directory
    avsg bench ...  plan | gather | hash-buckets | emulation | decode | calibrate | all
    avsg demo       plan + gather over decode steps of a selection trace
    avsg doctor     backends, versions, host mapping, and a self-test against the reference
    avsg trace ...  the trace lab: replay policies, synthesize, inspect
    avsg serve-sim  serving under a buffer memory budget: schedulers compared (a model)

A mistake in the arguments, a corrupted or unreadable input file, an output that cannot be written
or a size this machine cannot allocate prints one line on stderr and exits with status 2
(``avsg.cli_util``); ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import sys
from typing import List, Optional

from .cli_util import INPUT_ERRORS, OneLineParser, mark_leaves, report_error


def plain(text: str) -> str:
    """A docstring paragraph as help text: no RST markup."""
    return text.replace("``", "'").replace("**", "")


def build_parser() -> OneLineParser:
    from . import demo, doctor
    from .runtime import generate as generate_cmd
    from .runtime import run as run_cmd

    parser = OneLineParser(prog="avsg", description="AVSG: miss-only KV-cache offload for "
                           "DeepSeek Sparse Attention (run, generate, bench, demo, doctor, trace, serve-sim)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for every error")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    run_parser = sub.add_parser("run", help="decode in offload / avsg / device modes, compared",
                                description=plain(run_cmd.__doc__.split("\n\n")[0]))
    run_cmd.add_arguments(run_parser)
    run_parser.set_defaults(func=run_cmd.main)
    gen_parser = sub.add_parser("generate", help="greedy generation from a checkpoint",
                                description=plain(generate_cmd.__doc__.split("\n\n")[0]))
    generate_cmd.add_arguments(gen_parser)
    gen_parser.set_defaults(func=generate_cmd.main)
    bench_parser = sub.add_parser("bench", help="benchmarks and models (plan, gather, "
                                  "hash-buckets, emulation, decode, calibrate, all)",
                                  description="Benchmarks: each prints a table, writes JSON and "
                                  "plots under --out (default avsg-results/bench-<command>/).")
    bench_sub = bench_parser.add_subparsers(dest="bench", required=True, parser_class=OneLineParser)
    from .bench import COMMANDS
    for name, (module_name, help_text) in COMMANDS.items():
        module = __import__(f"avsg.bench.{module_name}", fromlist=["add_arguments"])
        p = bench_sub.add_parser(name, help=help_text,
                                 description=plain(module.__doc__.split("\n\n")[0]))
        module.add_arguments(p)
        p.set_defaults(func=module.main)
    demo_parser = sub.add_parser("demo", help="plan + gather over decode steps of a trace")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.main)
    doctor_parser = sub.add_parser("doctor", help="what this machine runs, checked against the reference",
                                   description=plain(doctor.__doc__.split("\n\n")[0]))
    doctor.add_arguments(doctor_parser)
    doctor_parser.set_defaults(func=doctor.main)
    from .budget import cli as serve_sim
    sim_parser = sub.add_parser("serve-sim", help="serving under a buffer memory budget: "
                                "fixed, Spin ratio and elastic schedulers (a model)",
                                description=plain(serve_sim.__doc__.split("\n\n")[0]))
    serve_sim.add_arguments(sim_parser)
    sim_parser.set_defaults(func=serve_sim.main)
    try:
        from .traces.cli import add_trace_commands
    except ImportError:
        pass
    else:
        add_trace_commands(sub)
    mark_leaves(parser)
    return parser


def _name(args) -> str:
    sub = {"bench": "bench", "trace": "trace_command"}.get(args.command)
    sub = getattr(args, sub, None) if sub else None
    return f"{args.command} {sub}" if sub else args.command


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    options = vars(args).pop("_options", ())   # the command's options, for report_error
    try:
        return int(args.func(args) or 0)
    except INPUT_ERRORS as e:
        if args.debug:
            raise
        return report_error(f"avsg {_name(args)}", e, options)
    except KeyboardInterrupt:
        print(f"avsg {_name(args)}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
