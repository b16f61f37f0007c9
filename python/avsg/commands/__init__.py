"""The ``avsg`` commands, one module each, all written one way: ``add_arguments(parser)`` adds
the command's options and ``main(args) -> int`` runs it. A group (``bench``, ``trace``) is a
subpackage of such modules. :data:`COMMANDS` lists them; :func:`build_parser` builds the parser
from that table, and :func:`main` runs one command line.

    avsg run        the decode runtime in offload / avsg / device modes, side by side
    avsg generate   greedy generation from a checkpoint directory
    avsg bench ...  plan | gather | hash-buckets | emulation | decode | calibrate | all
    avsg demo       plan + gather over decode steps of a selection trace
    avsg doctor     backends, versions, host mapping, and a self-test against the reference
    avsg trace ...  the trace lab: replay policies, synthesize, inspect, MTP replay
    avsg serve-sim  serving under a buffer memory budget: schedulers compared (a model)

A mistake in the arguments or in an ``AVSG_*`` environment variable, a corrupted or unreadable
input file, an output that cannot be written or a size this machine cannot allocate prints one line
on stderr and exits with status 2 (:mod:`avsg.cli_util`); ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Dict, List, Optional, Tuple, Union

from ..cli_util import (INPUT_ERRORS, OneLineParser, UsageError, check_environment,
                        empty_argument, forget_outputs, mark_leaves, register_command_runner,
                        report_error)

Leaf = Tuple[str, str]                              # (module under avsg.commands, one-line help)
Group = Tuple[str, str, Dict[str, Leaf]]            # (group help, description, its commands)

#: command name -> a leaf, or a group of leaves
COMMANDS: Dict[str, Union[Leaf, Group]] = {
    "run": ("run", "decode in offload / avsg / device modes, compared"),
    "generate": ("generate", "greedy generation from a checkpoint"),
    "bench": ("benchmarks and models (plan, gather, hash-buckets, emulation, decode, calibrate, all)",
              "Benchmarks: each prints a table, writes JSON and plots under --out (default "
              "avsg-results/bench-<command>/).", {
        "plan": ("avsg.lab.commands.bench.plan", "hash plan vs dual-pointer on the paper's three grids (modelled "
                 "time)"),
        "gather": ("avsg.lab.commands.bench.gather", "gather partitions S1 / S2 / S3 on the paper's grid, link-aware "
                   "(modelled)"),
        "hash-buckets": ("avsg.lab.commands.bench.hash_buckets", "index overflow (stash) against hash table size, on "
                         "a trace"),
        "emulation": ("avsg.lab.commands.bench.emulation", "CPU time per call of plan and gather, strict vs fast "
                      "emulation"),
        "decode": ("avsg.lab.commands.bench.decode", "modelled DeepSeek-V3.2 decode step on a 910B per mode (an "
                   "estimate)"),
        "calibrate": ("avsg.lab.commands.bench.calibrate", "NPU microbenchmarks that write a hardware profile (NPU "
                      "only)"),
        "all": ("avsg.lab.commands.bench.run_all", "every benchmark in turn (--quick: reduced grids); headline "
                "ratios last"),
    }),
    "demo": ("demo", "plan + gather over decode steps of a trace"),
    "doctor": ("doctor", "what this machine runs, checked against the reference"),
    "trace": ("selection traces: replay policies, synthesize, inspect",
              "Selection traces and buffer-policy replay.", {
        "replay": ("avsg.lab.commands.trace.replay", "replay buffer policies on a trace, report hit rates"),
        "synth": ("avsg.lab.commands.trace.synth", "write synthetic traces (AVSG paper settings)"),
        "info": ("avsg.lab.commands.trace.info", "validate a trace and print its summary"),
        "mtp": ("avsg.lab.commands.trace.mtp", "MTP replay: shared vs separate vs cold-start buffers"),
    }),
    "serve-sim": ("avsg.lab.commands.serve_sim", "serving under a buffer memory budget: fixed, Spin ratio and "
                  "elastic schedulers (a model)"),
}


def plain(text: str) -> str:
    """A docstring paragraph as help text: no RST markup (roles such as :mod:`x` become x)."""
    return re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", text).replace("``", "'").replace("**", "")


def _add_leaf(sub, name: str, leaf: Leaf) -> None:
    module_name, help_text = leaf
    module = importlib.import_module(module_name if module_name.startswith("avsg.")
                                     else f"{__name__}.{module_name}")
    parser = sub.add_parser(name, help=help_text,
                            description=plain((module.__doc__ or help_text).split("\n\n")[0]))
    module.add_arguments(parser)
    # also after the command (``avsg run --debug``); SUPPRESS keeps the top-level value unless given
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks for every error")
    parser.set_defaults(func=module.main)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="avsg", description="AVSG: miss-only KV-cache offload for "
                           "DeepSeek Sparse Attention (" + ", ".join(COMMANDS) + ")")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for every error")
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"avsg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, entry in COMMANDS.items():
        if len(entry) == 2:
            _add_leaf(sub, name, entry)
            continue
        help_text, description, leaves = entry
        group = sub.add_parser(name, help=help_text, description=description)
        group_sub = group.add_subparsers(dest=f"{name}_command", required=True,
                                         metavar="{" + ",".join(leaves) + "}",
                                         parser_class=OneLineParser)
        for leaf_name, leaf in leaves.items():
            _add_leaf(group_sub, leaf_name, leaf)
    mark_leaves(parser)
    return parser


def _name(args) -> str:
    sub = getattr(args, f"{args.command}_command", None)
    return f"{args.command} {sub}" if sub else args.command


def main(argv: Optional[List[str]] = None) -> int:
    """Run one ``avsg`` command line (``sys.argv[1:]`` when None); returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:     # reported by the command that was given them, with its usage line
        given = list(sys.argv[1:] if argv is None else argv)
        before = given[:given.index(args.command)] if args.command in given else []
        if any(u in before for u in unknown):     # `avsg --bogus trace info`: not the command's
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        vars(args).pop("_leaf").error(f"unrecognized arguments: {' '.join(unknown)}")
    vars(args).pop("_leaf", None)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    options = vars(args).pop("_options", ())   # the command's options, for report_error
    names = vars(args).pop("_names", {})
    forget_outputs()
    try:
        # before the command's first line: an AVSG_* variable the library would refuse later
        # (or did not apply at import) is the same one-line usage error as a bad option
        check_environment()
        empty = empty_argument(args, names)
        if empty is not None:
            raise UsageError(f"{empty}: expected a value, got an empty string")
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # the reader went away (`avsg ... | head`): nothing is wrong and nothing is left to say;
        # stdout points at devnull so that the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except INPUT_ERRORS as e:
        if args.debug:
            raise
        return report_error(f"avsg {_name(args)}", e, options)
    except KeyboardInterrupt:
        print(f"avsg {_name(args)}: interrupted", file=sys.stderr)
        return 130


# a command that runs others (``avsg bench all``) runs them exactly as their command lines
# would, through this entry point, without importing the table back up
register_command_runner(main)
