"""`tiertp profile`: build TP performance tables.

Two modes share the command:
  tiertp profile [measure options]      measure the real engine (tiertp.profiling.cli)
  tiertp profile build-defaults [...]   compose the shipped GPU tables from
                                        measured kernel latencies (tiertp.profiles.build_defaults)
  tiertp profile compose --config ...   compose a table the same way for another model,
                                        from its config.json (tiertp.profiles.from_config)
Each mode's module exposes `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib

# mode name -> module; the measuring mode is the default (no mode word).
MODES = {
    "build-defaults": "tiertp.profiles.build_defaults",
    "compose": "tiertp.profiles.from_config",
}
MEASURE_MODULE = "tiertp.profiling.cli"


def _mode_parser(prog: str, module: str) -> argparse.ArgumentParser:
    mod = importlib.import_module(module)
    parser = argparse.ArgumentParser(
        prog=prog, description=(mod.__doc__ or "").strip(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mod.add_arguments(parser)
    parser.set_defaults(_run=mod.run)
    return parser


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure TP performance tables, or compose GPU tables from kernel latencies",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        # Everything after `profile` goes to the mode's own parser; with no
        # option prefix here, `--model ...` and `-h` land in `rest` too.
        prefix_chars="+",
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    rest = list(args.rest)
    if rest and rest[0] in MODES:
        parser = _mode_parser(f"tiertp profile {rest[0]}", MODES[rest[0]])
        rest = rest[1:]
    else:
        parser = _mode_parser("tiertp profile", MEASURE_MODULE)
        if rest in ([], ["-h"], ["--help"]):
            parser.epilog = f"other modes: {', '.join(MODES)} (tiertp profile MODE --help)"
    parsed = parser.parse_args(rest)
    return int(parsed._run(parsed) or 0)
