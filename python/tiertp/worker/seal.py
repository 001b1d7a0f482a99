"""Sealed control-plane frames (docs/worker-protocol.md, "Sealing").

Every frame between the gateway (or any other client) and a node agent is
ChaCha20-Poly1305 under a key derived per session from the cluster's
pre-shared key, so only a peer holding that key is heard. A frame that does
not open (another key, altered, another session) or that comes again (a
counter not above the last one opened) is refused. The Rust twin is
rust-scheduler/gateway/src/worker/seal.rs: the same bytes both ways (a fixed
test vector in both test suites).
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
SESSION_BYTES = 16
TAG_BYTES = 16
VERSION = 1
TO_AGENT, TO_CLIENT = 1, 2
# version, direction, session id, session start (Unix ms), counter.
_HEADER = struct.Struct(f">BB{SESSION_BYTES}sQQ")
HEADER_BYTES = _HEADER.size
# HKDF's info: the session key is for this protocol and version only.
_KDF_INFO = b"tiertp control v1"


class ControlKey:
    """The pre-shared control-plane key; its repr never shows it, so a config
    holding one can be printed or logged."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes):
        if len(raw) != KEY_BYTES:
            raise ValueError(f"a control-plane key is {KEY_BYTES} bytes, got {len(raw)}")
        self._raw = bytes(raw)

    @classmethod
    def generate(cls) -> ControlKey:
        return cls(os.urandom(KEY_BYTES))

    @property
    def raw(self) -> bytes:
        return self._raw

    def __repr__(self) -> str:
        return "ControlKey(<redacted>)"

    __str__ = __repr__

    def __reduce__(self):
        # Pickled, it would travel in the clear (e.g. to a subprocess): it is read from its file instead.
        raise TypeError("a ControlKey is not pickled; pass its key file")


class SealError(ValueError):
    """A frame that does not open: the reason, never the frame or the key."""


@dataclass(frozen=True)
class Header:
    """A frame's clear part, authenticated with it (the AEAD's associated data)."""

    direction: int
    session: bytes
    started_ms: int  # when the client started the session: an agent takes only recent new sessions
    counter: int

    @classmethod
    def parse(cls, frame: bytes) -> Header:
        if len(frame) < HEADER_BYTES + TAG_BYTES:
            raise SealError("not a sealed frame (too short)")
        version, direction, session, started_ms, counter = _HEADER.unpack_from(frame)
        if version != VERSION:
            raise SealError("not a sealed frame (unknown version)")
        if direction not in (TO_AGENT, TO_CLIENT):
            raise SealError("not a sealed frame (unknown direction)")
        return cls(direction, session, started_ms, counter)

    def encode(self) -> bytes:
        return _HEADER.pack(VERSION, self.direction, self.session, self.started_ms, self.counter)

    def nonce(self) -> bytes:
        """Direction and counter: unique per frame under the session's own key."""
        return struct.pack(">B3xQ", self.direction, self.counter)


class Session:
    """One connection's session: its id, start and key (HKDF-SHA256 of the
    pre-shared key, salted with the id). Each direction gets a Sealer and an
    Opener."""

    def __init__(self, key: ControlKey, session_id: bytes, started_ms: int):
        if len(session_id) != SESSION_BYTES:
            raise ValueError(f"a session id is {SESSION_BYTES} bytes, got {len(session_id)}")
        derived = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=session_id, info=_KDF_INFO).derive(key.raw)
        self._aead = ChaCha20Poly1305(derived)
        self.id = session_id
        self.started_ms = started_ms

    @classmethod
    def start(cls, key: ControlKey) -> Session:
        """A client's new session: a random id, started now."""
        return cls(key, os.urandom(SESSION_BYTES), int(time.time() * 1000))

    @classmethod
    def join(cls, key: ControlKey, header: Header) -> Session:
        """The session a client started, as named by one of its frames (an agent's side)."""
        return cls(key, header.session, header.started_ms)

    def sealer(self, direction: int) -> Sealer:
        return Sealer(self, direction)

    def opener(self, direction: int) -> Opener:
        return Opener(self, direction)


class Sealer:
    """Seals one direction's frames, counting from 0."""

    def __init__(self, session: Session, direction: int):
        self._session, self._direction, self.next = session, direction, 0

    def seal(self, plaintext: bytes) -> bytes:
        s = self._session
        header = Header(self._direction, s.id, s.started_ms, self.next)
        self.next += 1
        aad = header.encode()
        return aad + s._aead.encrypt(header.nonce(), plaintext, aad)


class Opener:
    """Opens one direction's frames: each must be of this session, authentic,
    and counted above the last one opened."""

    def __init__(self, session: Session, direction: int):
        self._session, self._direction, self.last = session, direction, None

    def open(self, frame: bytes) -> bytes:
        header = Header.parse(frame)
        s = self._session
        if header.direction != self._direction:
            raise SealError("sealed for the other direction")
        if header.session != s.id or header.started_ms != s.started_ms:
            raise SealError("sealed for another session")
        try:
            plaintext = s._aead.decrypt(header.nonce(), frame[HEADER_BYTES:], frame[:HEADER_BYTES])
        except InvalidTag:
            raise SealError("does not open under this key (another key, or altered)") from None
        # Checked once authentic: a forged counter must not move `last`.
        if self.last is not None and header.counter <= self.last:
            raise SealError(f"replayed: counter {header.counter}, already at {self.last}")
        self.last = header.counter
        return plaintext
