"""The `tiertp` command line: one entry point, one subcommand per module.

Each name in COMMANDS is a module `tiertp.commands.<name>` exposing
`register(subparsers)`, which adds its parser and sets `func` (called with
the parsed args; returns an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# The one list of subcommands (module names under tiertp.commands).
COMMANDS = [
    "demo",
    "plan",
    "bench",
    "profile",
    "replay",
    "worker",
    "serve",
    "gateway",
    "keys",
    "fidelity",
]


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiertp", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"tiertp.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except (UserError, ValueError, OSError) as e:
        print(f"tiertp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
