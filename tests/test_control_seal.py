"""The sealed control plane, in process: frames (tiertp.worker.seal, the
same bytes as the gateway's Rust twin), the agent's gate (whom it hears:
one session start window, no replays on any connection) and its
rate-limited refusal warnings. The live agent and gateway:
tests/test_control_plane.py."""

from __future__ import annotations

import logging

import msgspec
import pytest

from tiertp.worker.gate import FORGET_S, SKEW_S, Gate
from tiertp.worker.refusals import RefusalLog
from tiertp.worker.seal import HEADER_BYTES, TO_AGENT, TO_CLIENT, ControlKey, Header, SealError, Session

PING = msgspec.msgpack.encode({"type": "ping"})
# rust-scheduler/gateway/src/worker/seal.rs checks the same frame: a key of
# bytes 0..31, session id 0..15 started at 1715000000000 ms, counter 5.
VECTOR_FRAME = ("0101000102030405060708090a0b0c0d0e0f0000018f4df73e000000000000000005"
                "3ccf2d979264bcf1b9ae1ca986d8f5a5bf4c0b8cc1300d6d88b410")


def test_the_cross_language_test_vector():
    session = Session(ControlKey(bytes(range(32))), bytes(range(16)), 1_715_000_000_000)
    sealer = session.sealer(TO_AGENT)
    sealer.next = 5
    assert sealer.seal(PING).hex() == VECTOR_FRAME
    assert session.opener(TO_AGENT).open(bytes.fromhex(VECTOR_FRAME)) == PING


def _pair(key: ControlKey):
    client = Session.start(key)
    return client.sealer(TO_AGENT), client.opener(TO_CLIENT), client


def test_tampered_replayed_foreign_or_reflected_frames_do_not_open():
    key = ControlKey.generate()
    seal, back, client = _pair(key)
    frame = seal.seal(PING)
    agent = Session.join(key, Header.parse(frame))
    opener = agent.opener(TO_AGENT)
    for i in (0, 1, 2, HEADER_BYTES - 1, HEADER_BYTES, len(frame) - 1):
        bad = bytearray(frame)
        bad[i] ^= 1
        with pytest.raises(SealError):
            opener.open(bytes(bad))
    assert opener.open(frame) == PING
    with pytest.raises(SealError, match="replayed: counter 0, already at 0"):
        opener.open(frame)
    with pytest.raises(SealError, match="does not open under this key"):
        Session.join(ControlKey.generate(), Header.parse(frame)).opener(TO_AGENT).open(seal.seal(PING))
    with pytest.raises(SealError, match="other direction"):
        back.open(seal.seal(PING))
    assert back.open(agent.sealer(TO_CLIENT).seal(b"pong")) == b"pong"


def test_the_key_is_never_shown_nor_pickled():
    key = ControlKey(bytes([0xAB]) * 32)
    assert "ab" not in repr(key).lower() and "ab" not in str(key).lower() and "<redacted>" in repr(key)
    import pickle

    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(key)
    with pytest.raises(ValueError, match="32 bytes, got 31"):
        ControlKey(bytes(31))


class Clock:
    def __init__(self):
        self.wall, self.mono = 1_800_000_000.0, 1000.0

    def advance(self, s: float) -> None:
        self.wall += s
        self.mono += s


@pytest.fixture
def gate(caplog):
    caplog.set_level(logging.WARNING, logger="tiertp.worker.gate")
    clock = Clock()
    key = ControlKey.generate()
    g = Gate(key, wall=lambda: clock.wall, clock=lambda: clock.mono)
    return g, key, clock


def _session(key: ControlKey, clock: Clock, age_s: float = 0.0) -> Session:
    return Session(key, Session.start(key).id, int((clock.wall - age_s) * 1000))


def test_the_gate_opens_a_key_holders_session_and_seals_its_replies(gate):
    g, key, clock = gate
    s = _session(key, clock)
    seal, back = s.sealer(TO_AGENT), s.opener(TO_CLIENT)
    assert g.open(b"conn-1", [seal.seal(PING)], "10.1.2.3") == PING
    assert back.open(g.seal(b"conn-1", b"pong")) == b"pong"
    assert g.seal(b"conn-2", b"pong") is None  # a connection it never heard: nothing to seal for


def test_the_gate_refuses_strangers_replays_and_stale_sessions_naming_the_peer(gate, caplog):
    g, key, clock = gate
    s = _session(key, clock)
    first = s.sealer(TO_AGENT).seal(PING)
    stranger = _session(ControlKey.generate(), clock).sealer(TO_AGENT)
    attempts = [
        (b"a", [PING], "not a sealed frame (too short)"),  # plaintext msgpack
        (b"b", [stranger.seal(PING)], "does not open under this key"),
        (b"c", [first, b"extra"], "2 frames"),
        (b"d", [_session(key, clock, age_s=SKEW_S + 5).sealer(TO_AGENT).seal(PING)], "started 305 s ago"),
        (b"e", [_session(key, clock, age_s=-SKEW_S - 5).sealer(TO_AGENT).seal(PING)], "305 s in the future"),
    ]
    for i, (conn, frames, why) in enumerate(attempts):
        caplog.clear()
        assert g.open(conn, frames, f"10.0.0.{i}") is None
        assert why in caplog.text and f"from 10.0.0.{i} (connection {conn.hex()})" in caplog.text, caplog.text
    assert g.open(b"f", [first], "10.0.0.9") == PING
    caplog.clear()
    # The same frame again, on another connection: a replay.
    assert g.open(b"g", [first], "10.0.0.10") is None
    assert "replayed" in caplog.text
    assert g.seal(b"g", b"x") is None  # the replayer has no session to be answered in


def test_a_session_is_forgotten_only_once_it_could_not_be_taken_again(gate):
    g, key, clock = gate
    s = _session(key, clock)
    seal = s.sealer(TO_AGENT)
    first = seal.seal(PING)
    assert g.open(b"conn", [first], "h") == PING
    clock.advance(FORGET_S + 1)
    g.forget_idle()
    assert g.seal(b"conn", b"x") is None
    # Replayed now, its first frame is too old to start a session.
    assert g.open(b"other", [first], "h") is None
    assert g.open(b"conn", [seal.seal(PING)], "h") is None


def test_a_flood_of_refusals_logs_one_line_per_peer_per_interval(caplog):
    caplog.set_level(logging.WARNING)
    now = [0.0]
    log = RefusalLog(logging.getLogger("refusals-test"), interval_s=10.0, max_peers=2, clock=lambda: now[0])
    for _ in range(1000):
        log.refused("10.0.0.1", b"\x01", "bad")
    assert len(caplog.records) == 1
    now[0] = 11.0
    log.refused("10.0.0.1", b"\x01", "bad")
    assert len(caplog.records) == 2 and "999 more refused from it" in caplog.records[-1].getMessage()
    # Many addresses at once share one line past max_peers.
    for i in range(100):
        log.refused(f"10.9.0.{i}", b"\x02", "bad")
    assert len(caplog.records) == 4 and "one of many other peers" in caplog.records[-1].getMessage()
