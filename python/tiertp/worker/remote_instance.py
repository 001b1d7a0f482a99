"""`RemoteInstance`: the agent's proxy of the TP instance inside an execution process.

tiertp.switching.SwitchCoordinator moves requests between TpInstance
objects it calls directly; in the node agent every instance lives in its own
execution process (so a dying instance takes only its process down). This
proxy gives the coordinator the same surface
(tiertp.switching.participant.SwitchParticipant) by sending ``op`` messages
(tiertp.worker.instance_ops, run by tiertp.worker.switch_ops) and waiting
for their ``op_done``.

While it waits, the process may still send what it sent before reading the
op (tokens of the iteration that just ended, a load report): those are handed
to `dispatch` (the agent's normal handler) at once, in order, so no token is
delayed past the switch or attributed to the wrong process.
"""

from __future__ import annotations

import itertools
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from tiertp.execution.rank_call import RankCall
from tiertp.execution.records import RequestState
from tiertp.worker import instance_ops as op_types
from tiertp.worker.process import DEAD, READY, ExecProcess


class RemoteOpFailed(RuntimeError):
    """An op failed in the execution process (the message says why) or the
    process died or did not answer in time."""


@dataclass(frozen=True)
class RemoteSpec:
    """What the coordinator reads of an instance's spec."""

    model: str
    tp: int
    devices: tuple[int, ...]


class _Pending:
    def __init__(self, remote: RemoteInstance, op_id: int, what: str, timeout_s: float):
        self._remote, self._op_id, self._what, self._timeout_s = remote, op_id, what, timeout_s
        self._done, self._value = False, None

    def result(self):
        if not self._done:
            self._value = self._remote._wait(self._op_id, self._what, self._timeout_s)
            self._done = True
        return self._value


class RemoteInstance:
    """The TP instance of `proc` (READY), as a SwitchCoordinator participant.

    `max_tokens(rid)` gives an adopted request's max_tokens (the execution
    loop stops it there; the instance itself does not know it)."""

    _ids = itertools.count(1)

    def __init__(self, proc: ExecProcess, model: str, dispatch: Callable[[ExecProcess, dict], None],
                 max_tokens: Callable[[int], int], timeout_s: float = 120.0):
        self.proc = proc
        self.spec = RemoteSpec(model, proc.group.tp, tuple(proc.group.devices))
        self._dispatch, self._max_tokens, self._timeout_s = dispatch, max_tokens, timeout_s
        self._paused = False
        self.held: dict[str, list[int]] = {"running": [], "waiting": []}  # as of the last pause
        self.info = self._call(op_types.Info())

    # --- state -------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.proc.state == DEAD or self.proc.popen.poll() is not None

    @property
    def paused(self) -> bool:
        return self._paused

    # --- the SwitchParticipant surface the coordinator uses ---------------
    def pause(self) -> None:
        self.held = self._call(op_types.Pause())
        self._paused = True

    def resume(self) -> None:
        self._call(op_types.Resume())
        self._paused = False

    def export(self, rids: list[int]) -> list[RequestState]:
        return self._call(op_types.Export(list(rids)))

    def park(self, rids: list[int]) -> list[RequestState]:
        """Export and park those of `rids` still running (finished ones are
        skipped: the states say which); the process may iterate its other
        requests while they are parked."""
        return self._call(op_types.Park(list(rids)))

    def unpark(self, rids: list[int]) -> None:
        self._call(op_types.Unpark(list(rids)))

    def adopt(self, states: list[RequestState]) -> None:
        self._call(op_types.Adopt(list(states), {s.rid: self._max_tokens(s.rid) for s in states}))

    def release(self, rids: list[int]) -> None:
        self._call(op_types.Release(list(rids)))

    def free_slots(self, slots: list[int]) -> None:
        self._call(op_types.FreeSlots(list(slots)))

    def call_on_ranks(self, call: RankCall, timeout_s: float | None = None) -> list:
        return self.begin_call(call, timeout_s).result()

    def begin_call(self, call: RankCall, timeout_s: float | None = None) -> _Pending:
        wait = timeout_s or self._timeout_s
        return _Pending(self, self._send(op_types.CallRanks(call, timeout_s)), f"call {call.describe()}",
                        wait + 5.0)

    # --- the wire ----------------------------------------------------------
    def _call(self, op: op_types.InstanceOp) -> Any:
        return self._wait(self._send(op), op.what, self._timeout_s)

    def _send(self, op: op_types.InstanceOp) -> int:
        if self.proc.state != READY:
            raise RemoteOpFailed(f"{self._where()}: {op.what}: the execution process is {self.proc.state}")
        op_id = next(self._ids)
        self.proc.send({"type": "op", "op_id": op_id, "op": pickle.dumps(op)})
        return op_id

    def _wait(self, op_id: int, what: str, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteOpFailed(f"{self._where()}: {what}: no answer in {timeout_s:.0f} s")
            try:
                ready = self.proc.socket.poll(min(100, max(1, int(left * 1000))))
            except zmq.ZMQError as e:  # the agent closed the socket: the process was killed
                raise RemoteOpFailed(f"{self._where()}: {what}: {e}") from None
            if not ready:
                if self.proc.popen.poll() is not None:
                    raise RemoteOpFailed(f"{self._where()}: {what}: the execution process exited with code "
                                         f"{self.proc.popen.returncode}" +
                                         (f" ({self.proc.exit_note})" if self.proc.exit_note else ""))
                continue
            msg = self.proc.receive()
            if msg["type"] == "op_done" and msg["op_id"] == op_id:
                if not msg["ok"]:
                    raise RemoteOpFailed(f"{self._where()}: {what}: {msg['error']}")
                return pickle.loads(msg["value"])
            if msg["type"] == "op_done":  # an answer nobody waits for any more (a timed-out op)
                continue
            self._dispatch(self.proc, msg)

    def _where(self) -> str:
        return f"TP{self.spec.tp} process on devices {list(self.spec.devices)}"

