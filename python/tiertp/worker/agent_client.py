"""A client's connection to a node agent: one DEALER socket and one sealed
session (tiertp.worker.seal) with the agent's key, messages as dicts
(docs/worker-protocol.md). For tools, `tiertp serve`'s readiness checks and
tests; the gateway has its own, in Rust."""

from __future__ import annotations

import zmq

from tiertp.worker import protocol as P
from tiertp.worker.seal import TO_AGENT, TO_CLIENT, ControlKey, Session


class AgentClient:
    """Connected to `endpoint`; `close` it (or use it as a context manager)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, key: ControlKey):
        self.endpoint = endpoint
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        session = Session.start(key)
        self._sealer, self._opener = session.sealer(TO_AGENT), session.opener(TO_CLIENT)
        try:
            self.sock.connect(endpoint)
        except zmq.ZMQError:
            self.sock.close(0)  # else the context could never terminate
            raise

    def send(self, msg: dict) -> None:
        self.send_payload(P.encode(msg))

    def send_payload(self, payload: bytes) -> None:
        """One message's bytes, sealed as they are (tests send malformed ones)."""
        self.sock.send(self._sealer.seal(payload))

    def poll(self, timeout_ms: int) -> bool:
        """Whether a message is there within `timeout_ms`."""
        return bool(self.sock.poll(timeout_ms))

    def recv(self) -> dict:
        """The next message (blocking); SealError if it does not open."""
        return P.decode(self._opener.open(self.sock.recv()))

    def close(self) -> None:
        self.sock.close(0)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()
