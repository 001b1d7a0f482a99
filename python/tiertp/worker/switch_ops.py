"""The execution process's side of TP switching: the ``op`` messages.

The agent drives switches and prefill -> decode hand-offs with
tiertp.switching.SwitchCoordinator over `RemoteInstance` proxies
(tiertp.worker.remote_instance); each proxy call is one ``op`` message to
the execution process owning that TP instance, answered by one ``op_done``.
Ops run between two iterations, so the instance is at an iteration boundary
whenever one runs.

Wire format (internal to one node: the payloads are pickles):
``op`` {op_id, name, arg: pickle} -> ``op_done`` {op_id, ok, value: pickle |
None, error: str | None}. Names (`OPS`):

- ``info``: the instance's InstanceInfo;
- ``pause`` / ``resume``: stop / restart iterating; ``pause`` answers
  {"running": [rid...], "waiting": [rid...]} (running: in the instance, KV
  included; waiting: not admitted yet, they move as metadata);
- ``export`` [rid...] -> [RequestState...];
- ``adopt`` ([RequestState...], {rid: max_tokens}): the requests join the
  running batch, their KV already written into the instance's slots;
- ``park`` [rid...] -> [RequestState...]: a prefill -> decode hand-off
  takes those of the requests still running (others finished meanwhile and
  are skipped) out of the batch, KV kept, and answers their states (as
  ``export``); the process may resume iterating its other requests while
  the destination copies that KV; then ``release`` (moved) or ``unpark``;
- ``unpark`` [rid...]: parked requests rejoin the batch (the hand-off
  failed); the next iteration gives each the token it would have had;
- ``release`` [rid...]: the requests moved away: free their KV, drop them;
- ``free_slots`` [slot...]; ``call`` (target, arg, timeout_s): call_on_ranks.

An op that kills the instance (InstanceFailed) is answered, then the process
exits as a dead worker (RunnerDied) so the agent restarts it.
"""

from __future__ import annotations

import pickle
import traceback
from typing import TYPE_CHECKING

from tiertp.execution.errors import InstanceFailed
from tiertp.worker.exec_request import ExecRequest
from tiertp.worker.runner import RunnerDied

if TYPE_CHECKING:
    from tiertp.worker.executor import ExecutionLoop

OPS = ("info", "pause", "resume", "export", "park", "unpark", "adopt", "release", "free_slots", "call")


class SwitchOps:
    """Runs ``op`` messages against an ExecutionLoop whose runner owns a TP instance."""

    def __init__(self, loop: ExecutionLoop):
        self.loop = loop

    def handle(self, msg: dict) -> dict:
        """The ``op_done`` answer to `msg`; raises RunnerDied after answering when the instance died."""
        op_id, name = msg["op_id"], msg["name"]
        try:
            if name not in OPS:
                raise ValueError(f"unknown op {name!r}; expected one of: {', '.join(OPS)}")
            instance = getattr(self.loop.runner, "instance", None)
            if instance is None:
                raise RuntimeError("this execution process's step runner owns no TP instance (the 'engine' runner "
                                   "cannot export KV or switch TP; use the default 'instance' runner)")
            arg = pickle.loads(msg["arg"]) if msg.get("arg") is not None else None
            value = getattr(self, f"_{name}")(instance, arg)
            return {"type": "op_done", "op_id": op_id, "ok": True, "value": pickle.dumps(value), "error": None}
        except (InstanceFailed, RunnerDied) as e:
            self.loop.send({"type": "op_done", "op_id": op_id, "ok": False, "value": None,
                            "error": f"InstanceFailed: {e}"})
            raise RunnerDied(str(e)) from e
        except Exception as e:  # noqa: BLE001 - the agent's coordinator decides (rollback)
            traceback.print_exc()
            return {"type": "op_done", "op_id": op_id, "ok": False, "value": None,
                    "error": f"{type(e).__name__}: {e}"}

    # --- the ops ---------------------------------------------------------
    def _info(self, instance, _arg):
        return instance.info

    def _pause(self, instance, _arg):
        loop = self.loop
        loop.paused = True
        instance.pause()
        # Finished requests' KV is freed lazily with the next step; a paused
        # instance may not step for a long time, and a switch needs the space.
        loop.runner.flush_releases()
        return {"running": list(loop.running), "waiting": list(loop.waiting)}

    def _resume(self, instance, _arg):
        self.loop.paused = False
        instance.resume()

    def _export(self, instance, rids):
        return instance.export(list(rids))

    def _park(self, instance, rids):
        loop = self.loop
        rids = [rid for rid in rids if rid in loop.running]
        if not rids:
            return []
        states = loop.runner.park(rids)
        for rid in rids:
            loop.parked[rid] = loop.running.pop(rid)
        loop.send_load()
        return states

    def _unpark(self, instance, rids):
        loop = self.loop
        back = [rid for rid in rids if rid in loop.parked]  # a cancelled one is gone already
        if back:
            loop.runner.unpark(back)
            for rid in back:
                loop.running[rid] = loop.parked.pop(rid)
            loop.send_load()

    def _adopt(self, instance, arg):
        states, max_tokens = arg
        loop = self.loop
        instance.adopt(list(states))
        loop.runner.adopted([s.rid for s in states])
        for s in states:
            sp = s.sampling
            loop.running[s.rid] = ExecRequest(s.rid, list(s.token_ids[:s.prompt_len]), max_tokens[s.rid],
                                              sp.temperature, sp.top_p, sp.seed, tuple(sp.stop_token_ids),
                                              output=list(s.token_ids[s.prompt_len:]))
        loop.send_load()

    def _release(self, instance, rids):
        loop = self.loop
        moved = [rid for rid in rids if rid in loop.running or rid in loop.parked]
        if moved:
            instance.release(moved)
            loop.runner.moved_away(moved)
        for rid in rids:
            loop.running.pop(rid, None)
            loop.parked.pop(rid, None)
            if loop.waiting.pop(rid, None) is not None:
                loop.policy.remove(rid)
        loop.send_load()

    def _free_slots(self, instance, slots):
        instance.free_slots(list(slots))

    def _call(self, instance, arg):
        target, call_arg, timeout_s = arg
        return instance.call_on_ranks(target, call_arg, timeout_s)
