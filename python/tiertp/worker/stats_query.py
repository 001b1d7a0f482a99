"""Asking a node agent for its `stats` over the worker protocol, as any
client of the protocol may (tools and tests; the gateway has its own in Rust)."""

from __future__ import annotations

import time

import zmq

from tiertp.worker import protocol as P
from tiertp.worker.agent_client import AgentClient
from tiertp.worker.seal import ControlKey, SealError


class StatsUnanswered(RuntimeError):
    """The agent did not answer a stats request in time, or the socket failed."""


def ask_stats(endpoint: str, key: ControlKey, timeout_s: float) -> dict:
    """The agent's `stats` reply (docs/worker-protocol.md); StatsUnanswered
    naming the endpoint when it does not answer within `timeout_s` (an agent
    holding another key answers nothing)."""
    ctx = zmq.Context()
    try:
        with AgentClient(ctx, endpoint, key) as agent:
            agent.send({"type": P.STATS})
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if agent.poll(int(left * 1000) + 1):
                    msg = agent.recv()
                    if msg.get("type") == P.STATS:
                        return msg
        raise StatsUnanswered(f"the agent at {endpoint} did not answer a stats request in {timeout_s:.0f} s "
                              "(is it up, and does it hold the same key file?)")
    except (zmq.ZMQError, SealError) as e:
        raise StatsUnanswered(f"asking the agent at {endpoint} for its stats failed: {e}") from e
    finally:
        ctx.term()
