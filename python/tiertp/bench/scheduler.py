"""Planner latency (GPUs x tiers) and dispatch throughput of the Rust core."""

from __future__ import annotations

import argparse
import json

from tiertp import _scheduler


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a small, fast run (for tests)")


def run(args: argparse.Namespace) -> dict:
    return json.loads(_scheduler.bench_scheduler(quick=args.quick))
