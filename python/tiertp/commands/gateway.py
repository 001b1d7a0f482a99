"""`tiertp gateway`: the OpenAI-compatible gateway alone, driving node agents
on other machines (`tiertp worker --bind tcp://0.0.0.0:PORT` on each).

The agents are the cluster's nodes, given as `--worker tcp://HOST:PORT=DEVICES`
(repeatable) and/or `--cluster FILE.toml` ([[worker]] tables with endpoint
and devices; the file's nodes come first). GPUs are numbered across nodes in
that order; TP groups never span two nodes. Waits (--ready-timeout) until at
least one agent answers with a device ready, then runs the gateway (Rust, in
this process) as `tiertp serve` does: tiers, profile and TP levels as there,
prints the URL and each tier's key, serves until SIGINT (Ctrl-C) or SIGTERM.
An agent that is not up yet, or goes away, is out of the plan (requests it
held are re-dispatched if they had no token yet, else fail naming the lost
worker) and joins again when it answers. The agents run the same model and
TP levels as given here, and hold the same control-plane key (--key-file,
required: `tiertp keys FILE` makes one); `tiertp serve` is the one-machine
shortcut.
"""

from __future__ import annotations

import argparse
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from tiertp.commands.cluster_spec import WorkerEntry, cluster_workers, parse_worker
from tiertp.commands.gateway_options import ServeInputError, add_gateway_options, gateway_settings
from tiertp.commands.gateway_runner import Stop, serve_gateway, stop_on_signals
from tiertp.commands.keys import add_key_file_argument
from tiertp.profile_source import MEASURED, SYNTHETIC
from tiertp.worker.config import check_tp_levels

if TYPE_CHECKING:
    from tiertp.worker.seal import ControlKey

log = logging.getLogger(__name__)

# How long one poll of an agent waits for its `stats`.
_POLL_S = 1.0
# How long the gateway waits to connect to each agent at start. The ones
# that did not answer the polls are dialled in the background anyway, so a
# long wait would only delay the start; a live agent connects in far less.
_CONNECT_S = 2.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="serve the OpenAI API: the gateway alone, over agents on other machines",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", type=parse_worker, action="append", default=[], metavar="tcp://HOST:PORT=DEVICES",
                   help="a node agent (`tiertp worker --bind tcp://0.0.0.0:PORT --devices DEVICES`) and its "
                        "device count; repeatable, one per node")
    p.add_argument("--cluster", type=Path, default=None, metavar="FILE.toml",
                   help="the nodes as a TOML file: [[worker]] tables, each with endpoint = \"tcp://HOST:PORT\" "
                        "and devices = N (before any --worker)")
    add_gateway_options(
        p, model_help=", the one the agents serve (its tokenizer and name)",
        tp_levels_help="TP levels the planner may use, e.g. 1,2: the ones the agents run (their --tp-levels; "
                       "powers of two including 1, a group never larger than its node; default: 1)")
    p.add_argument("--ready-timeout", type=float, default=600.0,
                   help="seconds to wait for the first agent with a device ready (default 600)")
    add_key_file_argument(
        p, "the control-plane key the agents hold (required; `tiertp keys FILE` makes one): every "
           "frame to and from them is sealed under it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tiertp.worker.key_file import require_key_file

    try:
        nodes = cluster_workers(args.cluster, args.worker)
        check_tp_levels(tuple(args.tp_levels))
    except ValueError as e:
        raise ServeInputError(str(e)) from None
    largest = max(nodes, key=lambda n: n.devices)
    if max(args.tp_levels) > largest.devices:
        raise ServeInputError(f"--tp-levels {max(args.tp_levels)}: no node has that many devices (the largest, "
                              f"{largest.endpoint}, has {largest.devices}); a TP group stays inside one node")
    if args.profile == MEASURED:
        raise ServeInputError(f"--profile {MEASURED}: the gateway has no devices of its own to measure; give a "
                              f"profile of the agents' machines (`tiertp profile` there) or {SYNTHETIC}")
    key = require_key_file(args.key_file, "the agents hear only a gateway holding their control-plane key")
    settings = gateway_settings(args)
    devices = sum(n.devices for n in nodes)
    with stop_on_signals() as stop:
        try:
            wait_for_agents(nodes, key, args.ready_timeout, stop)
            return serve_gateway("tiertp gateway", settings, [(n.endpoint, n.devices) for n in nodes], key,
                                 f"{devices} device(s) on {len(nodes)} node(s)", stop, connect_timeout_s=_CONNECT_S)
        except KeyboardInterrupt:
            log.info("interrupted: shutting down")
            return 130
        finally:
            print("tiertp gateway: stopped", flush=True)


def wait_for_agents(nodes: list[WorkerEntry], key: ControlKey, timeout_s: float, stop: Stop) -> None:
    """Polls every agent's `stats` until one has a device ready; TimeoutError
    naming each agent's state after `timeout_s`. An agent that answers with
    another device count than its entry is an error: the plan would name
    devices it does not have."""
    from tiertp.worker.stats_query import StatsUnanswered, ask_stats

    def poll(node: WorkerEntry) -> dict | None:
        try:
            return ask_stats(node.endpoint, key, timeout_s=_POLL_S)
        except StatsUnanswered:
            return None

    log.info("waiting up to %.0f s for one of %d agent(s) to have a device ready", timeout_s, len(nodes))
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(len(nodes)) as pool:
        while True:
            replies = list(pool.map(poll, nodes))
            for node, stats in zip(nodes, replies):
                if stats is not None and len(stats["devices"]) != node.devices:
                    raise ServeInputError(f"agent {node.endpoint} runs {len(stats['devices'])} device(s), not the "
                                          f"{node.devices} it is given (--worker / --cluster)")
            states = [_state(stats) for stats in replies]
            if "ready" in states:
                for node, state in zip(nodes, states):
                    if state == "ready":
                        log.info("agent %s: ready (%d device(s))", node.endpoint, node.devices)
                    else:
                        log.warning("agent %s: %s; its devices join the plan once ready", node.endpoint, state)
                return
            if stop.is_set():
                raise KeyboardInterrupt
            if time.monotonic() >= deadline:
                where = ", ".join(f"{n.endpoint} ({s})" for n, s in zip(nodes, states))
                raise TimeoutError(f"no agent had a device ready within {timeout_s:g} s (--ready-timeout): {where}")
            stop.wait(0.5)


def _state(stats: dict | None) -> str:
    if stats is None:
        return "not answering: not up, or holding another key"
    states = sorted({d.get("state", "ready") for d in stats["devices"]})
    return "ready" if "ready" in states else f"no device ready ({', '.join(states)})"
