"""Asking a node agent for its `stats` over the worker protocol, as any
client of the protocol may (tools and tests; the gateway has its own in Rust)."""

from __future__ import annotations

import time

import zmq

from tiertp.worker import protocol as P


class StatsUnanswered(RuntimeError):
    """The agent did not answer a stats request in time, or the socket failed."""


def ask_stats(endpoint: str, timeout_s: float) -> dict:
    """The agent's `stats` reply (docs/worker-protocol.md); StatsUnanswered
    naming the endpoint when it does not answer within `timeout_s`."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(P.encode({"type": P.STATS}))
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if sock.poll(int(left * 1000) + 1):
                msg = P.decode(sock.recv())
                if msg.get("type") == P.STATS:
                    return msg
        raise StatsUnanswered(f"the agent at {endpoint} did not answer a stats request in {timeout_s:.0f} s")
    except zmq.ZMQError as e:
        raise StatsUnanswered(f"asking the agent at {endpoint} for its stats failed: {e}") from e
    finally:
        sock.close(0)
        ctx.term()
