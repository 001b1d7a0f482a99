"""The execution process's side of TP switching: the ``op`` messages.

The agent drives switches and prefill -> decode hand-offs with
tiertp.switching.SwitchCoordinator over `RemoteInstance` proxies
(tiertp.worker.remote_instance); each proxy call is one ``op`` message to
the execution process owning that TP instance, answered by one ``op_done``.
Ops run between two iterations, so the instance is at an iteration boundary
whenever one runs. The ops and what each answers: tiertp.worker.instance_ops.

Wire format (internal to one node: the payloads are pickles):
``op`` {op_id, op: pickle} -> ``op_done`` {op_id, ok, value: pickle | None,
error: str | None}.

An op that kills the instance (InstanceFailed) is answered, then the process
exits as a dead worker (RunnerDied) so the agent restarts it.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable
from typing import Any

from tiertp.execution.errors import InstanceFailed
from tiertp.worker import instance_ops as op_types
from tiertp.worker.batch_state import BatchState
from tiertp.worker.step_runner import RunnerDied


class SwitchOps:
    """Runs ``op`` messages against the process's requests (`requests`);
    `send` sends the process's messages, `send_load` a load report."""

    def __init__(self, requests: BatchState, send: Callable[[dict], None], send_load: Callable[[], None]):
        self.requests, self._send, self._send_load = requests, send, send_load

    def handle(self, msg: dict) -> dict:
        """The ``op_done`` answer to `msg`; raises RunnerDied after answering when the instance died."""
        op_id = msg["op_id"]
        try:
            self.requests.switching_runner()  # refuse every op, not only those touching KV, without one
            value = self.apply(pickle.loads(msg["op"]))
            return {"type": "op_done", "op_id": op_id, "ok": True, "value": pickle.dumps(value), "error": None}
        except (InstanceFailed, RunnerDied) as e:
            self._send({"type": "op_done", "op_id": op_id, "ok": False, "value": None,
                        "error": f"InstanceFailed: {e}"})
            raise RunnerDied(str(e)) from e
        except Exception as e:  # noqa: BLE001 - the agent's coordinator decides (rollback)
            traceback.print_exc()
            return {"type": "op_done", "op_id": op_id, "ok": False, "value": None,
                    "error": f"{type(e).__name__}: {e}"}

    def apply(self, op: op_types.InstanceOp) -> Any:
        """Run one op; its answer's value."""
        requests = self.requests
        match op:
            case op_types.Info():
                return requests.switching_runner().instance.info
            case op_types.Pause():
                return requests.pause()
            case op_types.Resume():
                requests.resume()
                return None
            case op_types.Export():
                return requests.switching_runner().instance.export(list(op.rids))
            case op_types.Park():
                states = requests.park(list(op.rids))
                if states:
                    self._send_load()
                return states
            case op_types.Unpark():
                if requests.unpark(list(op.rids)):
                    self._send_load()
                return None
            case op_types.Adopt():
                requests.adopt(list(op.states), op.max_tokens)
                self._send_load()
                return None
            case op_types.Release():
                requests.release_moved(list(op.rids))
                self._send_load()
                return None
            case op_types.FreeSlots():
                requests.switching_runner().instance.free_slots(list(op.slots))
                return None
            case op_types.CallRanks():
                return requests.switching_runner().instance.call_on_ranks(op.call, op.timeout_s)
        raise ValueError(f"unknown op {op!r}; expected one of: "
                         f"{', '.join(t.what for t in op_types.InstanceOp.__args__)}")
