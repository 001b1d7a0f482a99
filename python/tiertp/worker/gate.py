"""Whom a node agent hears: only frames sealed under its control-plane key
(tiertp.worker.seal), each one once. Anything else (another key, an altered
or replayed frame, a plaintext one) gets no reply at all and a rate-limited
warning naming the peer (tiertp.worker.refusals).

Sessions are the clients' (one per connection). A new one is taken only
when its first frame opens and its start (the client's clock) is within
SKEW_S of this node's clock, and every session is remembered until it has
been idle FORGET_S: by then its start is too old for it to be taken again,
so a recorded session cannot be replayed later, on any connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tiertp.worker.refusals import RefusalLog
from tiertp.worker.seal import TO_AGENT, TO_CLIENT, ControlKey, Header, Opener, Sealer, SealError, Session

log = logging.getLogger(__name__)

# How far a new session's start may be from this node's clock (as Kerberos's
# default skew): the clocks of a cluster's machines must agree within this.
SKEW_S = 300.0
# An idle session is forgotten after this: twice the skew, so that its start
# is past the window whatever the two clocks said.
FORGET_S = 2 * SKEW_S
# Sessions remembered at most; a new one past this is refused (clients hold
# one per connection: the gateway one per agent, a tool one per question).
MAX_SESSIONS = 10_000
_SWEEP_S = 10.0


@dataclass
class _Known:
    opener: Opener
    sealer: Sealer
    peer: bytes  # the connection (ZeroMQ routing id) replies go to
    last_active: float


class Gate:
    def __init__(self, key: ControlKey, wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic):
        self._key, self._wall, self._clock = key, wall, clock
        self._sessions: dict[bytes, _Known] = {}
        self._by_peer: dict[bytes, bytes] = {}
        self._next_sweep = 0.0
        self.refusals = RefusalLog(log, clock=clock)

    def open(self, peer: bytes, frames: list[bytes], address: str) -> bytes | None:
        """The plaintext of a client's message (`frames`: after the routing id),
        or None: refused, logged, and to be left unanswered."""
        try:
            if len(frames) != 1:
                raise SealError(f"{len(frames)} frames; a sealed message is one")
            header = Header.parse(frames[0])
            if header.direction != TO_AGENT:
                raise SealError("sealed for the other direction")
            known = self._sessions.get(header.session)
            if known is not None:
                plaintext = known.opener.open(frames[0])
            else:
                session = Session.join(self._key, header)
                opener = session.opener(TO_AGENT)
                plaintext = opener.open(frames[0])  # first: only a key holder may start a session
                self._check_new(header)
                known = _Known(opener, session.sealer(TO_CLIENT), peer, 0.0)
                self._sessions[header.session] = known
        except SealError as e:
            self.refusals.refused(address, peer, str(e))
            return None
        if known.peer != peer and self._by_peer.get(known.peer) == header.session:
            del self._by_peer[known.peer]  # replies follow the session to its newest connection
        known.peer, known.last_active = peer, self._clock()
        self._by_peer[peer] = header.session
        return plaintext

    def seal(self, peer: bytes, plaintext: bytes) -> bytes | None:
        """A message to the connection `peer`, sealed in its session; None if
        it has none (forgotten, or never heard)."""
        known = self._sessions.get(self._by_peer.get(peer, b""))
        if known is None:
            return None
        known.last_active = self._clock()
        return known.sealer.seal(plaintext)

    def _check_new(self, header: Header) -> None:
        age_s = self._wall() - header.started_ms / 1000
        if abs(age_s) > SKEW_S:
            when = f"{age_s:.0f} s ago" if age_s > 0 else f"{-age_s:.0f} s in the future"
            raise SealError(f"a new session that started {when}: a replay, a client idle for over "
                            f"{FORGET_S:.0f} s, or clocks more than {SKEW_S:.0f} s apart")
        if len(self._sessions) >= MAX_SESSIONS:
            self.forget_idle(force=True)
            if len(self._sessions) >= MAX_SESSIONS:
                raise SealError(f"{MAX_SESSIONS} sessions already open")

    def forget_idle(self, force: bool = False) -> None:
        """Forget sessions idle over FORGET_S (every _SWEEP_S at most, unless `force`)."""
        now = self._clock()
        if now < self._next_sweep and not force:
            return
        self._next_sweep = now + _SWEEP_S
        for sid, k in list(self._sessions.items()):
            if now - k.last_active > FORGET_S:
                del self._sessions[sid]
                if self._by_peer.get(k.peer) == sid:
                    del self._by_peer[k.peer]
