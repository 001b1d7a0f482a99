"""Wire names and the msgpack codec of docs/worker-protocol.md.

Every name the protocol uses lives here once; parsing checks against these
lists and error messages list the valid names. Messages are msgpack maps with
a "type" key, one per ZeroMQ frame. The same codec carries the internal
agent ⇄ execution process messages (see tiertp.worker.executor).
"""

from __future__ import annotations

from typing import Any

import msgspec

from tiertp import _scheduler

# Client → agent.
SUBMIT, CANCEL, HAND_OFF, APPLY_PLAN, STATS, PING = "submit", "cancel", "hand_off", "apply_plan", "stats", "ping"
CLIENT_TYPES = (SUBMIT, CANCEL, HAND_OFF, APPLY_PLAN, STATS, PING)
# Agent → client.
TOKENS, ERROR, PLAN_APPLIED, HANDED_OFF, PONG = "tokens", "error", "plan_applied", "handed_off", "pong"

# Why a `hand_off` was not made (the `code` of a `handed_off` with ok false);
# the request keeps decoding where it is. UNKNOWN_GROUP: not an active group
# here; GROUP_NOT_READY: the source or destination process cannot take part
# in KV moves now; NOT_RUNNING: the request is not running on a process here
# (finished, cancelled, held, or moved meanwhile); MOVE_FAILED: the KV move
# failed and was rolled back.
UNKNOWN_GROUP, GROUP_NOT_READY, NOT_RUNNING, MOVE_FAILED = (
    "unknown_group", "group_not_ready", "not_running", "move_failed")
HAND_OFF_FAILURES = (UNKNOWN_GROUP, GROUP_NOT_READY, NOT_RUNNING, MOVE_FAILED)

# Error codes of `error` messages. SLO_UNATTAINABLE: shed because it could not
# start before its deadline (the submit's `start_within_s`).
WORKER_DIED, CANCELLED, BAD_REQUEST, OVERLOADED, INTERNAL, SLO_UNATTAINABLE = (
    "worker_died", "cancelled", "bad_request", "overloaded", "internal", "slo_unattainable")
ERROR_CODES = (WORKER_DIED, CANCELLED, BAD_REQUEST, OVERLOADED, INTERNAL, SLO_UNATTAINABLE)

# Roles and classes are the Rust scheduler's lists (one spelling for both sides).
ROLES = tuple(_scheduler.ROLES)
CLASSES = tuple(_scheduler.DISPATCH_CLASSES)

U64_MAX = 2**64 - 1

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class ProtocolError(ValueError):
    """A message that cannot be accepted; `code` is an ERROR_CODES value and
    `request_id` the request it concerns (None when it names none)."""

    def __init__(self, message: str, code: str = BAD_REQUEST, request_id: int | None = None):
        super().__init__(message)
        self.code = code
        self.request_id = request_id


def encode(msg: dict[str, Any]) -> bytes:
    return _encoder.encode(msg)


def decode(frame: bytes) -> dict[str, Any]:
    """One frame → a map with a string "type"; ProtocolError naming the problem otherwise."""
    try:
        msg = _decoder.decode(frame)
    except msgspec.DecodeError as e:
        raise ProtocolError(f"frame is not valid msgpack ({e})") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"message must be a msgpack map, got {type(msg).__name__}")
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise ProtocolError('message has no string "type" field')
    return msg


def error(code: str, message: str, request_id: int | None = None) -> dict[str, Any]:
    assert code in ERROR_CODES, code
    return {"type": ERROR, "id": request_id, "code": code, "message": message}


def handed_off(request_id: int, group: list[int], failure: str | None = None,
               message: str | None = None) -> dict[str, Any]:
    """The answer to a `hand_off`: made (no `failure`), or a HAND_OFF_FAILURES code and why."""
    assert failure is None or failure in HAND_OFF_FAILURES, failure
    return {"type": HANDED_OFF, "id": request_id, "group": group, "ok": failure is None, "code": failure,
            "message": message}
