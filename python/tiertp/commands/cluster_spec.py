"""Which node agents `tiertp gateway` drives: `--worker tcp://HOST:PORT=DEVICES`
options and cluster files, each agent with the devices it runs. Agents are
the cluster's nodes, in the order given; every malformed entry is an error
naming it.

A cluster file (TOML), one table per node:

    [[worker]]
    endpoint = "tcp://10.0.0.2:7100"
    devices = 4
"""

from __future__ import annotations

import argparse
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tiertp._scheduler import MAX_GPUS_PER_NODE

# tcp://HOST:PORT, HOST a name, an IPv4 address or a bracketed IPv6 address:
# the gateway reaches agents over TCP only.
_ENDPOINT = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]+)")
_EXAMPLE = "tcp://10.0.0.2:7100"
_FIELDS = {"endpoint", "devices"}


@dataclass(frozen=True)
class WorkerEntry:
    """One node: its agent's ZeroMQ endpoint and how many devices it runs."""

    endpoint: str
    devices: int


def check_endpoint(endpoint: str) -> str:
    """The endpoint, or ValueError saying what is wrong with it."""
    m = _ENDPOINT.fullmatch(endpoint)
    if not m:
        raise ValueError(f"endpoint {endpoint!r} is not tcp://HOST:PORT (e.g. {_EXAMPLE})")
    if not 1 <= int(m["port"]) <= 65535:
        raise ValueError(f"endpoint {endpoint!r}: port {m['port']} is not in 1..65535")
    return endpoint


def check_devices(devices: object, where: str) -> int:
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_GPUS_PER_NODE:
        raise ValueError(f"{where}: devices must be an integer from 1 to {MAX_GPUS_PER_NODE} "
                         f"(a node's GPUs), got {devices!r}")
    return devices


def parse_worker(text: str) -> WorkerEntry:
    """argparse type of --worker: tcp://HOST:PORT=DEVICES."""
    endpoint, sep, devices = text.rpartition("=")
    try:
        if not sep:
            raise ValueError(f"expected tcp://HOST:PORT=DEVICES (e.g. {_EXAMPLE}=4), got {text!r}")
        if not devices.strip().isdigit():
            raise ValueError(f"{text!r}: DEVICES must be an integer, got {devices!r}")
        return WorkerEntry(check_endpoint(endpoint), check_devices(int(devices), repr(text)))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def load_cluster(path: Path) -> list[WorkerEntry]:
    """The nodes of a cluster file, in order; ValueError naming the file and
    the entry for anything malformed."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--cluster {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--cluster {path}: not valid TOML: {e}") from None
    unknown = sorted(set(doc) - {"worker"})
    if unknown:
        raise ValueError(f"--cluster {path}: unknown key(s) {unknown}; expected [[worker]] tables")
    tables = doc.get("worker")
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"--cluster {path}: no [[worker]] tables (each: endpoint = \"{_EXAMPLE}\", devices = N)")
    entries = []
    for i, t in enumerate(tables, 1):
        where = f"--cluster {path}: [[worker]] {i}"
        if not isinstance(t, dict):
            raise ValueError(f"{where}: expected a table, got {t!r}")
        problems = [f"missing {k}" for k in sorted(_FIELDS - set(t))]
        problems += [f"unknown key {k!r}" for k in sorted(set(t) - _FIELDS)]
        if problems:
            raise ValueError(f"{where}: {'; '.join(problems)} (each [[worker]] has endpoint and devices)")
        if not isinstance(t["endpoint"], str):
            raise ValueError(f"{where}: endpoint must be a string like \"{_EXAMPLE}\", got {t['endpoint']!r}")
        try:
            entries.append(WorkerEntry(check_endpoint(t["endpoint"]), check_devices(t["devices"], t["endpoint"])))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return entries


def cluster_workers(cluster: Path | None, workers: list[WorkerEntry]) -> list[WorkerEntry]:
    """The cluster file's nodes, then the --worker ones; ValueError when there
    are none or an endpoint is listed twice."""
    entries = (load_cluster(cluster) if cluster else []) + list(workers)
    if not entries:
        raise ValueError("no agents: give --worker tcp://HOST:PORT=DEVICES (repeatable) or --cluster FILE.toml")
    seen = set()
    for e in entries:
        if e.endpoint in seen:
            raise ValueError(f"agent {e.endpoint} is listed twice (--worker / --cluster)")
        seen.add(e.endpoint)
    return entries
