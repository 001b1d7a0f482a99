"""`tiertp keys FILE`: a new control-plane key for a cluster.

Writes a random 32-byte key to FILE (64 hex digits and a newline, mode 0600;
an existing file is kept unless --force) and prints the path, never the key.
Give the same file to the gateway (`tiertp gateway --key-file FILE`) and to
every node agent (`tiertp worker --key-file FILE`): each frame between them
is sealed under it (docs/worker-protocol.md, "Sealing"), and an agent hears
no one without it. Copy it to the nodes over a private channel (e.g. scp),
keeping its mode. `tiertp serve` needs none: it makes its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiertp.worker.key_file import write_key_file


def add_key_file_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    """--key-file FILE: the control-plane key file, for the commands that talk
    gateway <-> agent (`help_text` says what it is to that command)."""
    parser.add_argument("--key-file", type=Path, default=None, metavar="FILE", help=help_text)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="write a new control-plane key (gateway <-> node agents) to a file",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=Path, metavar="FILE", help="where to write the key (mode 0600)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    write_key_file(args.file, force=args.force)
    print(f"tiertp keys: wrote a new control-plane key to {args.file}", flush=True)
    return 0
