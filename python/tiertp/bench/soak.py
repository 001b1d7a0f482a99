"""Soak under faults: minutes of streamed load through the real gateway and
real node agents on this machine (`tiertp gateway` over `tiertp worker`s,
SGLang on CPU) while execution processes and whole agents are killed at
random moments, several of them while plans change (TP switches, hand-offs).
Counts every request sent by outcome: completed in SLO, completed late,
failed with a reason (the reasons tallied), and lost (no answer, or a hang
past the timeout). Lost should be 0: whatever is accepted ends.

A killed execution process is restarted by its agent; a killed agent is a
node gone (its GPUs leave the plan) and is started again on its port after
`--down-s`, as an operator's supervisor would."""

from __future__ import annotations

import argparse
import collections
import logging
import random
import tempfile
import time
from pathlib import Path

import httpx

from tiertp.bench.soak_cluster import Gateway, Node
from tiertp.bench.soak_load import FAILED, LOST, OUTCOMES, Load, TierLoad
from tiertp.worker.key_file import write_key_file

_TIERS = (TierLoad("chat", "sk-soak-chat", ttft_s=5.0, tpot_s=0.5),
          TierLoad("agent", "sk-soak-agent", ttft_s=20.0, tpot_s=2.0))
FAULTS = ("execution_process", "agent")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=300.0, metavar="S", help="seconds of load (default 300)")
    parser.add_argument("--fault-every", type=float, default=20.0, metavar="S",
                        help="mean seconds between faults (default 20; each at a random moment)")
    parser.add_argument("--rps", type=float, default=2.0, help="offered load, requests/s (default 2)")
    parser.add_argument("--nodes", type=int, default=2, help="node agents (default 2)")
    parser.add_argument("--devices", type=int, default=2, help="devices per node (default 2)")
    parser.add_argument("--tp-levels", default="1,2", help="TP levels every agent runs (default 1,2)")
    parser.add_argument("--model", default="tiny-llama", help="embedded model or HF directory (default tiny-llama)")
    parser.add_argument("--down-s", type=float, default=5.0, help="seconds a killed agent stays down (default 5)")
    parser.add_argument("--request-timeout", type=float, default=120.0, metavar="S",
                        help="a request with no end by then is lost (default 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=None, help="logs (default: a temporary folder)")


def _tiers_toml(path: Path) -> None:
    path.write_text("".join(f'[[tier]]\nname = "{t.name}"\nttft_ms = {t.ttft_s * 1e3:g}\ntpot_ms = {t.tpot_s * 1e3:g}\n'
                            f'api_keys = ["{t.api_key}"]\n\n' for t in _TIERS))


def _layout(url: str) -> tuple | None:
    """The gateway's TP groups now (first GPU, TP level, role), or None."""
    try:
        p = httpx.get(f"{url}/plan", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None
    return tuple(sorted((g["first_gpu"], g["tp"], str(g.get("role", ""))) for g in p.get("groups", [])))


def run(args: argparse.Namespace) -> dict:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tiertp-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    key_file, tiers = work / "control.key", work / "tiers.toml"
    write_key_file(key_file, force=True)
    _tiers_toml(tiers)
    rng = random.Random(args.seed)
    nodes = [Node(work, f"node{i}", args.model, args.devices, args.tp_levels, key_file) for i in range(args.nodes)]
    gateway = None
    faults, layouts, changes = [], set(), []  # changes: seconds into the load when the layout changed
    try:
        for n in nodes:
            n.start()
        gateway = Gateway(work, nodes, args.model, tiers, args.tp_levels, key_file, window_s=0.5)
        url = gateway.wait_url(timeout_s=600)
        deadline = time.monotonic() + 600
        while not all(n.ready() for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agents were not all ready within 600 s; logs in {work}")
            time.sleep(1)
        load = Load(url, args.model, list(_TIERS), args.rps, (4, 24), args.request_timeout, args.seed)
        start = time.monotonic()
        next_fault = start + rng.expovariate(1 / args.fault_every)
        down: dict[int, float] = {}
        last = None
        while (now := time.monotonic()) < start + args.duration:
            layout = _layout(url)
            if layout is not None:
                if last is not None and layout != last:
                    changes.append(now - start)
                layouts.add(layout)
                last = layout
            for i, back_at in list(down.items()):
                if now >= back_at:
                    nodes[i].start()
                    del down[i]
            if now >= next_fault:
                faults.append(_inject(rng, nodes, down, now - start, args.down_s))
                next_fault = now + rng.expovariate(1 / args.fault_every)
            time.sleep(0.5)
        for i in list(down):
            nodes[i].start()
        outcomes = load.finish()
    finally:
        if gateway is not None:
            gateway.stop()
        for n in nodes:
            n.stop()
    counts = collections.Counter(o.kind for o in outcomes)
    reasons = collections.Counter(o.reason for o in outcomes if o.kind in (FAILED, LOST))
    return {
        "benchmark": "soak",
        "duration_s": args.duration, "rps": args.rps, "nodes": args.nodes, "devices_per_node": args.devices,
        "tp_levels": args.tp_levels, "model": args.model, "fault_every_s": args.fault_every, "seed": args.seed,
        "sent": len(outcomes),
        **{k: counts.get(k, 0) for k in OUTCOMES},
        "failure_reasons": dict(reasons.most_common()),
        "faults": faults,
        "fault_counts": dict(collections.Counter(f["kind"] for f in faults)),
        # A fault within a second of a layout change hit a switch or a
        # hand-off under way (or the plan that a lost node forced).
        "faults_near_layout_change": sum(any(abs(f["at_s"] - c) <= 1.0 for c in changes) for f in faults),
        "layout_changes": len(changes),
        "layouts": len(layouts),
        "work_dir": str(work),
        "lost_ok": counts.get(LOST, 0) == 0,
    }


def _inject(rng: random.Random, nodes: list[Node], down: dict[int, float], at_s: float, down_s: float) -> dict:
    """One fault at a random live node: an execution process or the whole agent."""
    live = [i for i in range(len(nodes)) if i not in down and nodes[i].alive()]
    if not live:
        return {"at_s": round(at_s, 1), "kind": "none", "what": "no live node"}
    i = rng.choice(live)
    kind = rng.choice(FAULTS)
    if kind == "execution_process":
        what = nodes[i].kill_executor(rng)
        if what is not None:
            return {"at_s": round(at_s, 1), "kind": kind, "what": what}
    nodes[i].crash()
    down[i] = time.monotonic() + down_s
    return {"at_s": round(at_s, 1), "kind": "agent", "what": f"{nodes[i].name} (agent and its processes)"}
