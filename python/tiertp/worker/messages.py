"""Client messages parsed into typed, validated values.

Each parser takes a decoded map (see protocol.decode) and returns a frozen
dataclass, or raises ProtocolError whose message names the offending field.
Errors about a `submit` carry its `id` when the id itself is valid, so the
client learns which request was refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tiertp.execution.records import Sampling
from tiertp.tp_group import TpGroup
from tiertp.worker import protocol as P


@dataclass(frozen=True)
class Submit:
    id: int
    tier: str
    input_ids: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    cls: str
    group: TpGroup | None
    # Seconds after its arrival at the agent by which it must start prefilling
    # to still meet its TTFT; None: no deadline.
    start_within_s: float | None = None

    def deadline(self, arrived: float) -> float:
        """The latest time, on `arrived`'s clock, at which it may start; inf when it has no deadline."""
        return math.inf if self.start_within_s is None else arrived + self.start_within_s


@dataclass(frozen=True)
class Cancel:
    id: int


@dataclass(frozen=True)
class HandOff:
    """Move request `id` (prefilled, running here) to `group`: the client's decision."""

    id: int
    group: TpGroup


@dataclass(frozen=True)
class DevicePlan:
    """One device's assignment in an `apply_plan`."""

    device: int
    role: str
    tier: str
    tp_group: TpGroup
    batch_cap: int
    token_cap: int


@dataclass(frozen=True)
class PlanMove:
    """A request on a group the plan stops, and the new group (over the same
    devices) the control loop settled it on: where the TP switch takes it."""

    id: int
    tp_group: TpGroup


@dataclass(frozen=True)
class ApplyPlan:
    plan_id: int
    devices: tuple[DevicePlan, ...]
    moves: tuple[PlanMove, ...] = ()


def _field(msg: dict, name: str, where: str) -> Any:
    if name not in msg:
        raise P.ProtocolError(f"{where}: missing field {name!r}")
    return msg[name]


def _int(value: Any, name: str, where: str, lo: int = 0, hi: int = P.U64_MAX) -> int:
    # bool is an int subclass in Python; a msgpack true is never a valid number here.
    if not isinstance(value, int) or isinstance(value, bool):
        raise P.ProtocolError(f"{where}: {name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise P.ProtocolError(f"{where}: {name} = {value} is out of range [{lo}, {hi}]")
    return value


def _float(value: Any, name: str, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise P.ProtocolError(f"{where}: {name} must be a number, got {type(value).__name__}")
    return float(value)


def _seconds(value: Any, name: str, where: str) -> float:
    # NaN would compare false with every time; inf is accepted and means no deadline.
    # A negative value is not an error: the request is already late and is shed.
    seconds = _float(value, name, where)
    if math.isnan(seconds):
        raise P.ProtocolError(f"{where}: {name} must be a number of seconds, got NaN")
    return seconds


def _str(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str):
        raise P.ProtocolError(f"{where}: {name} must be a string, got {type(value).__name__}")
    return value


def _int_list(value: Any, name: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise P.ProtocolError(f"{where}: {name} must be a list of integers, got {type(value).__name__}")
    return tuple(_int(v, f"{name}[{i}]", where) for i, v in enumerate(value))


def _group(value: Any, name: str, where: str) -> TpGroup:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise P.ProtocolError(f"{where}: {name} must be [first_gpu, tp], got {value!r}")
    return TpGroup(_int(value[0], f"{name}[0]", where), _int(value[1], f"{name}[1]", where))


def _one_of(value: Any, name: str, where: str, valid: tuple[str, ...]) -> str:
    text = _str(value, name, where)
    if text not in valid:
        raise P.ProtocolError(f"{where}: unknown {name} {text!r}; expected one of: {', '.join(valid)}")
    return text


def parse_submit(msg: dict) -> Submit:
    rid = _int(_field(msg, "id", "submit"), "id", "submit")
    where = f"submit {rid}"
    try:
        s = _field(msg, "sampling", where)
        if not isinstance(s, dict):
            raise P.ProtocolError(f"{where}: sampling must be a map, got {type(s).__name__}")
        max_tokens = _int(_field(s, "max_tokens", where), "sampling.max_tokens", where, lo=1, hi=2**31 - 1)
        temperature = _float(s.get("temperature", 0.0), "sampling.temperature", where)
        top_p = _float(s.get("top_p", 1.0), "sampling.top_p", where)
        if temperature < 0:
            raise P.ProtocolError(f"{where}: sampling.temperature must be >= 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise P.ProtocolError(f"{where}: sampling.top_p must be in (0, 1], got {top_p}")
        sampling = Sampling(
            temperature=temperature,
            top_p=top_p,
            seed=None if s.get("seed") is None else _int(s["seed"], "sampling.seed", where, lo=-(2**63), hi=2**63 - 1),
            stop_token_ids=_int_list(s.get("stop_token_ids") or [], "sampling.stop_token_ids", where),
        )
        input_ids = _int_list(_field(msg, "input_ids", where), "input_ids", where)
        if not input_ids:
            raise P.ProtocolError(f"{where}: input_ids is empty")
        group = msg.get("group")
        start_within_s = msg.get("start_within_s")
        return Submit(
            id=rid,
            tier=_str(_field(msg, "tier", where), "tier", where),
            input_ids=input_ids,
            max_tokens=max_tokens,
            sampling=sampling,
            cls=_one_of(_field(msg, "class", where), "class", where, P.CLASSES),
            group=None if group is None else _group(group, "group", where),
            start_within_s=None if start_within_s is None else _seconds(start_within_s, "start_within_s", where),
        )
    except P.ProtocolError as e:
        e.request_id = rid
        raise


def parse_cancel(msg: dict) -> Cancel:
    return Cancel(_int(_field(msg, "id", "cancel"), "id", "cancel"))


def parse_hand_off(msg: dict) -> HandOff:
    rid = _int(_field(msg, "id", "hand_off"), "id", "hand_off")
    where = f"hand_off {rid}"
    return HandOff(rid, _group(_field(msg, "group", where), "group", where))


def _maps(items: Any, name: str, where: str) -> list[tuple[str, dict]]:
    """The maps of list field `name`, each with where it is (for errors)."""
    if not isinstance(items, (list, tuple)):
        raise P.ProtocolError(f"{where}: {name} must be a list, got {type(items).__name__}")
    out = []
    for i, d in enumerate(items):
        w = f"{where}: {name}[{i}]"
        if not isinstance(d, dict):
            raise P.ProtocolError(f"{w} must be a map, got {type(d).__name__}")
        out.append((w, d))
    return out


def parse_apply_plan(msg: dict) -> ApplyPlan:
    plan_id = _int(_field(msg, "plan_id", "apply_plan"), "plan_id", "apply_plan")
    where = f"apply_plan {plan_id}"
    devices = tuple(DevicePlan(
        device=_int(_field(d, "device", w), "device", w),
        role=_one_of(_field(d, "role", w), "role", w, P.ROLES),
        tier=_str(_field(d, "tier", w), "tier", w),
        tp_group=_group(_field(d, "tp_group", w), "tp_group", w),
        batch_cap=_int(_field(d, "batch_cap", w), "batch_cap", w, lo=1, hi=2**32 - 1),
        token_cap=_int(_field(d, "token_cap", w), "token_cap", w, hi=2**32 - 1),
    ) for w, d in _maps(_field(msg, "devices", where), "devices", where))
    moves = tuple(PlanMove(_int(_field(m, "id", w), "id", w), _group(_field(m, "tp_group", w), "tp_group", w))
                  for w, m in _maps(msg.get("moves", []), "moves", where))
    return ApplyPlan(plan_id, devices, moves)
