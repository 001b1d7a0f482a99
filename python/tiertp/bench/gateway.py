"""Gateway throughput and added latency: non-streaming /v1/completions
through the Rust gateway to mock workers over the real ZeroMQ protocol, on
loopback, with the load generator in the same process (Rust, keep-alive
connections, one request in flight each). The mock workers answer at once,
so the latency is what the gateway and the protocol add."""

from __future__ import annotations

import argparse
import json

from tiertp import _scheduler


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Defaults live in the Rust bench (BenchSettings); None keeps them.
    parser.add_argument("--requests", type=int, default=None, help="timed requests (default 100000)")
    parser.add_argument("--concurrency", type=int, default=None, help="client connections (default 64)")
    parser.add_argument("--workers", type=int, default=None, help="mock workers (default 2)")
    parser.add_argument("--max-tokens", type=int, default=None, help="output tokens per request (default 8)")
    parser.add_argument("--max-seconds", type=float, default=None, help="time bound of each phase (default 20)")
    parser.add_argument("--threads", type=int, default=None, help="runtime threads (default 2)")
    parser.add_argument("--quick", action="store_true", help="a small, fast run (for tests)")


def run(args: argparse.Namespace) -> dict:
    requests = args.requests
    if args.quick and requests is None:
        requests = 2000
    return json.loads(_scheduler.bench_gateway(
        requests=requests, concurrency=args.concurrency, workers=args.workers, max_tokens=args.max_tokens,
        max_seconds=args.max_seconds, threads=args.threads))
