"""`tiertp bench NAME --json`: run one benchmark, print one JSON object."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform

from tiertp.bench import BENCHES


def machine() -> dict:
    """The machine a benchmark ran on, recorded with its figures."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark and print JSON")
    bench_sub = p.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, module in BENCHES.items():
        mod = importlib.import_module(module)
        bp = bench_sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        bp.add_argument("--json", action="store_true", help="print JSON (the only output format)")
        mod.add_arguments(bp)
        bp.set_defaults(func=lambda args, mod=mod, name=name: _run(name, mod, args))


def _run(name: str, mod, args) -> int:
    result = {"benchmark": name, **mod.run(args), "machine": machine()}
    print(json.dumps(result, indent=2))
    return 0
