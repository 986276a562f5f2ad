"""The ``ckptsim`` command line: one subcommand per module in this package.

Each command module defines ``register(subparsers)``, which adds its parser and sets
``func(args) -> int``. Modules import their heavy dependencies inside ``func`` so that
``ckptsim --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from simulator.cli.common import OneLineParser, fail
from simulator.errors import InputError

COMMANDS = ("optimize", "simulate", "fit", "bench", "sweep", "plot", "demo")


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="ckptsim",
        description=(
            "How often should a large GPU training job checkpoint, and what do failures "
            "cost? Closed-form and simulated optimal intervals, measured checkpoint costs, "
            "and a controller that applies the answer in live PyTorch training."
        ),
        epilog="Run `ckptsim COMMAND --help` for each command's flags and examples.",
    )
    from simulator import __version__

    parser.add_argument("--version", action="version", version=f"ckptsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"simulator.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"simulator.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; 0 on success, 2 (one line on stderr) on bad input, 130 on Ctrl-C."""
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's own parser, whose --help lists what it takes
            command = getattr(args, "command", None)
            chooser = next(
                (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None
            )
            own = chooser.choices.get(command) if chooser and command else None
            (own or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except InputError as exc:
        return fail(" ".join(str(exc).split()), prog=f"ckptsim {args.command}")
    except BrokenPipeError:
        # `ckptsim ... | head` closed the pipe: not an error, and no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("ckptsim: interrupted", file=sys.stderr)
        return 130
