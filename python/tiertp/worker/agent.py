"""The node agent: the ROUTER socket of docs/worker-protocol.md and the
execution processes behind it.

One thread, one loop: poll the client socket and every execution process's
socket, handle what arrived, then a tick (keep-alive pings, death and hang
detection, due restarts). Requests are routed to a device's active TP group
(the submit's `group`, else the least loaded group of the request's tier,
else any group as best effort); a group whose process is not ready yet holds
them and sends them when it is. Each accepted request ends in exactly one
terminal message (see tiertp.worker.requests).

What issue 6 still needs here (this is its first step):
- warm processes at every candidate TP level: `warm_groups` lists only TP 1
  groups; `aligned_groups(devices, tp_levels)` is the full list once TP>1
  processes share their device's weights and the TP process groups are
  created up front;
- TP switching (pause at an iteration boundary, KV migration with
  tiertp.kv, resume, roll back on failure): plans that change a TP group are
  rejected with plan.TP_SWITCH_UNSUPPORTED;
- prefill/decode roles: roles are recorded and reported, but every group
  runs whole requests; the prefill → decode KV hand-off is not built.
"""

from __future__ import annotations

import logging
import signal
import time
import traceback
from collections import defaultdict

import zmq

from tiertp.worker import protocol as P
from tiertp.worker.config import AgentConfig
from tiertp.worker.groups import TpGroup
from tiertp.worker.messages import ApplyPlan, Submit, parse_apply_plan, parse_cancel, parse_submit
from tiertp.worker.plan import PlanRejected, check_plan, initial_assignments
from tiertp.worker.process import DEAD, READY, ExecProcess
from tiertp.worker.requests import InFlight, RequestTable
from tiertp.worker.runner import ModelLimits

log = logging.getLogger(__name__)

_POLL_MS = 50
_MAX_RESTART_DELAY_S = 30.0


class Agent:
    """A node agent for `cfg`. `run` blocks until `request_stop` (SIGINT/SIGTERM)
    and always stops every execution process before returning."""

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 1000)
        try:
            self.router.bind(cfg.bind)
        except zmq.ZMQError as e:
            self.router.close(linger=0)
            self.ctx.term()
            raise OSError(f"cannot bind the agent socket to {cfg.bind}: {e}") from None
        self.assign = initial_assignments(cfg.devices, cfg.batch_cap, cfg.token_cap)
        self.plan_id: int | None = None
        self.requests = RequestTable()
        self.procs: dict[TpGroup, ExecProcess] = {}
        self.limits: ModelLimits | None = None  # the model's; known once a process is ready
        self._generation = 0
        self._start_failures: dict[TpGroup, int] = defaultdict(int)
        self._restart_at: dict[TpGroup, float] = {}
        self._stop = False

    # ---- processes -------------------------------------------------------

    def warm_groups(self) -> list[TpGroup]:
        """The groups that get a warm process: TP 1 on every device, for now."""
        return [TpGroup(d, 1) for d in range(self.cfg.devices)]

    def _start(self, group: TpGroup) -> None:
        self._generation += 1
        a = self.assign[group.first]
        self.procs[group] = ExecProcess(self.ctx, self.cfg, group, self._generation, a.batch_cap, a.token_cap)

    def _on_ready(self, proc: ExecProcess) -> None:
        self._start_failures[proc.group] = 0
        self.limits = self.limits or proc.limits
        a = self.assign[proc.group.first]
        # A plan may have changed the caps while the process was starting.
        proc.send({"type": "caps", "batch_cap": a.batch_cap, "token_cap": a.token_cap})
        for req in self.requests.on_device(proc.group.first):
            if not req.sent:
                self._send_to_process(req, proc)

    def _on_death(self, proc: ExecProcess, reason: str) -> None:
        group = proc.group
        was_ready = proc.limits is not None
        log.error("device %d TP%d: %s; restarting it", group.first, group.tp, reason)
        where = f"device {group.first} (TP{group.tp} group {group.as_list()})"
        for req in self.requests.on_device(group.first):
            if req.sent and req.process_generation == proc.generation:
                self._fail(req.rid, P.WORKER_DIED, f"{where}: {reason}; the request was running there and is lost")
        if was_ready:
            delay = 0.0
        else:
            self._start_failures[group] += 1
            n = self._start_failures[group]
            delay = min(2.0 ** n, _MAX_RESTART_DELAY_S)
            if n >= self.cfg.max_start_failures:
                for req in self.requests.on_device(group.first):
                    self._fail(req.rid, P.WORKER_DIED, f"{where}: the execution process failed to start {n} times "
                               f"in a row ({reason}); last lines of its log ({proc.log_path}):\n{proc.log_tail()}")
        self._restart_at[group] = time.monotonic() + delay

    def _tick(self) -> None:
        for proc in list(self.procs.values()):
            reason = proc.check()
            if reason is not None:
                self._on_death(proc, reason)
        now = time.monotonic()
        for group, at in list(self._restart_at.items()):
            if at <= now:
                del self._restart_at[group]
                self._start(group)

    # ---- requests --------------------------------------------------------

    def _to_client(self, client: bytes, msg: dict) -> None:
        self.router.send_multipart([client, P.encode(msg)])

    def _fail(self, rid: int, code: str, message: str) -> None:
        req = self.requests.finish(rid)
        if req is not None:
            self._to_client(req.client, P.error(code, message, req.submit.id))

    def _check_limits(self, s: Submit, limits: ModelLimits) -> str | None:
        bad = [t for t in s.input_ids if t >= limits.vocab_size]
        if bad:
            return f"submit {s.id}: token id {bad[0]} is out of the model's vocabulary (size {limits.vocab_size})"
        total = len(s.input_ids) + s.sampling.max_tokens
        if total > limits.max_request_tokens:
            return (f"submit {s.id}: {len(s.input_ids)} prompt tokens + max_tokens {s.sampling.max_tokens} = {total} "
                    f"exceeds the {limits.max_request_tokens} tokens a request may hold on this worker")
        return None

    def _send_to_process(self, req: InFlight, proc: ExecProcess) -> None:
        problem = self._check_limits(req.submit, proc.limits)
        if problem:
            self._fail(req.rid, P.BAD_REQUEST, problem)
            return
        s = req.submit
        proc.send({"type": "add", "rid": req.rid, "input_ids": list(s.input_ids), "max_tokens": s.sampling.max_tokens,
                   "temperature": s.sampling.temperature, "top_p": s.sampling.top_p, "seed": s.sampling.seed,
                   "stop_token_ids": list(s.sampling.stop_token_ids), "cls": s.cls})
        req.sent = True
        req.process_generation = proc.generation

    def _active_groups(self) -> list[TpGroup]:
        return sorted({a.tp_group for a in self.assign.values()})

    def _load(self, group: TpGroup) -> int:
        proc = self.procs.get(group)
        held = sum(1 for r in self.requests.on_device(group.first) if not r.sent)
        return held + (proc.load["running"] + proc.load["waiting"] if proc else 0)

    def _route(self, s: Submit) -> TpGroup:
        active = self._active_groups()
        if s.group is not None:
            if s.group not in active:
                raise P.ProtocolError(f"submit {s.id}: group {s.group.as_list()} is not an active TP group on this "
                                      f"node (active: {[g.as_list() for g in active]})", request_id=s.id)
            return s.group
        # The dispatcher's rule (DESIGN.md §1): the tier's own groups, else any
        # group as best effort. Groups no plan has given a tier serve every tier.
        own = [g for g in active if self.assign[g.first].tier == s.tier]
        free = [g for g in active if self.assign[g.first].tier is None]
        return min(own or free or active, key=lambda g: (self._load(g), g))

    def _on_submit(self, client: bytes, msg: dict) -> None:
        s = parse_submit(msg)
        group = self._route(s)
        if self.limits is not None and (problem := self._check_limits(s, self.limits)):
            raise P.ProtocolError(problem, request_id=s.id)
        try:
            req = self.requests.add(client, s, group.first)
        except ValueError as e:
            raise P.ProtocolError(str(e), request_id=s.id) from None
        proc = self.procs.get(group)
        if proc is not None and proc.state == READY:
            self._send_to_process(req, proc)

    def _on_cancel(self, client: bytes, msg: dict) -> None:
        c = parse_cancel(msg)
        req = self.requests.lookup(client, c.id)
        if req is None:
            # id nil: an error naming this id would be a second terminal
            # message when the request has just finished.
            self._to_client(client, P.error(P.BAD_REQUEST, f"cancel: request {c.id} is not in flight "
                                             "(finished, cancelled, or never submitted)"))
            return
        proc = self.procs.get(self.assign[req.device].tp_group)
        if req.sent and proc is not None and proc.state == READY and proc.generation == req.process_generation:
            proc.send({"type": "cancel", "rid": req.rid})
        self._fail(req.rid, P.CANCELLED, f"request {c.id} cancelled by the client")

    def _on_apply_plan(self, client: bytes, msg: dict) -> None:
        t0 = time.perf_counter()
        plan_id = msg.get("plan_id")

        def reply(ok: bool, reason: str | None) -> None:
            self._to_client(client, {"type": P.PLAN_APPLIED, "plan_id": plan_id, "ok": ok, "reason": reason,
                                     "switch_ms": (time.perf_counter() - t0) * 1e3})

        if not isinstance(plan_id, int) or isinstance(plan_id, bool) or not 0 <= plan_id <= P.U64_MAX:
            raise P.ProtocolError(f"apply_plan: plan_id must be a u64, got {plan_id!r}")
        try:
            plan: ApplyPlan = parse_apply_plan(msg)
            new = check_plan(plan, self.assign, list(self.cfg.tp_levels))
        except (P.ProtocolError, PlanRejected) as e:
            log.warning("plan %d rejected: %s", plan_id, e)
            reply(False, str(e))
            return
        for group in self._active_groups():
            a, proc = new[group.first], self.procs.get(group)
            old = self.assign[group.first]
            caps_changed = (a.batch_cap, a.token_cap) != (old.batch_cap, old.token_cap)
            if proc is not None and proc.state == READY and caps_changed:
                proc.send({"type": "caps", "batch_cap": a.batch_cap, "token_cap": a.token_cap})
        self.assign = new
        self.plan_id = plan_id
        reply(True, None)

    def _stats(self) -> dict:
        devices = []
        for d, a in sorted(self.assign.items()):
            proc = self.procs.get(a.tp_group)
            load = proc.load if proc is not None and proc.state == READY else {"running": 0, "waiting": 0,
                                                                              "kv_used_tokens": 0}
            held = sum(1 for r in self.requests.on_device(a.tp_group.first) if not r.sent)
            devices.append({"device": d, "role": a.role, "tier": a.tier, "tp_group": a.tp_group.as_list(),
                            "running": load["running"], "waiting": load["waiting"] + held,
                            "kv_used_tokens": load["kv_used_tokens"],
                            "kv_capacity_tokens": self.cfg.max_total_tokens,
                            # The gateway plans only over ready devices (docs/worker-protocol.md).
                            "state": proc.state if proc is not None else DEAD})
        return {"type": P.STATS, "devices": devices, "plan_id": self.plan_id}

    def _on_client(self, frames: list[bytes]) -> None:
        client = frames[0]
        try:
            if len(frames) != 2:
                raise P.ProtocolError(f"expected one frame per message, got {len(frames) - 1}")
            msg = P.decode(frames[1])
            kind = msg["type"]
            if kind == P.SUBMIT:
                self._on_submit(client, msg)
            elif kind == P.CANCEL:
                self._on_cancel(client, msg)
            elif kind == P.APPLY_PLAN:
                self._on_apply_plan(client, msg)
            elif kind == P.STATS:
                self._to_client(client, self._stats())
            elif kind == P.PING:
                self._to_client(client, {"type": P.PONG})
            else:
                raise P.ProtocolError(f"unknown message type {kind!r}; expected one of: {', '.join(P.CLIENT_TYPES)}")
        except P.ProtocolError as e:
            self._to_client(client, P.error(e.code, str(e), e.request_id))
        except Exception as e:  # a bug here must not take the node down
            log.error("handling a client message failed:\n%s", traceback.format_exc())
            self._to_client(client, P.error(P.INTERNAL, f"agent error: {type(e).__name__}: {e}"))

    # ---- execution process messages ---------------------------------------

    def _on_process(self, proc: ExecProcess, msg: dict) -> None:
        kind = msg["type"]
        if kind == "ready":
            self._on_ready(proc)
        elif kind == "tokens":
            per_client: dict[bytes, list[dict]] = defaultdict(list)
            for item in msg["items"]:
                req = self.requests.get(item["rid"])
                if req is None or req.process_generation != proc.generation:
                    continue  # cancelled or failed meanwhile: its terminal message is already out
                out = {"id": req.submit.id, "tokens": [item["token"]], "finished": item["finished"],
                       "finish_reason": item["finish_reason"]}
                if not req.first_item_sent:
                    out["prompt_tokens"] = len(req.submit.input_ids)
                    req.first_item_sent = True
                req.generated += 1
                per_client[req.client].append(out)
                if item["finished"]:
                    self.requests.finish(req.rid)
            for client, items in per_client.items():
                self._to_client(client, {"type": P.TOKENS, "items": items})
        elif kind == "failed":
            for rid in msg["rids"]:
                self._fail(rid, P.INTERNAL, f"device {proc.group.first}: {msg['message']}")
        elif kind not in ("pong", "load", "exiting"):
            log.error("device %d: unknown message type %r from the execution process", proc.group.first, kind)

    # ---- loop ------------------------------------------------------------

    def request_stop(self, *_args) -> None:
        self._stop = True

    def run(self) -> None:
        log.info("node agent on %s: %d device(s), model %s, TP levels %s", self.cfg.bind, self.cfg.devices,
                 self.cfg.model, list(self.cfg.tp_levels))
        if any(t > 1 for t in self.cfg.tp_levels):
            log.warning("TP levels %s: no warm processes started for them (TP switching not implemented yet)",
                        [t for t in self.cfg.tp_levels if t > 1])
        try:
            for group in self.warm_groups():
                self._start(group)
            while not self._stop:
                poller = zmq.Poller()
                poller.register(self.router, zmq.POLLIN)
                live = [p for p in self.procs.values() if p.state != DEAD]
                for p in live:
                    poller.register(p.socket, zmq.POLLIN)
                # pyzmq retries a poll a signal interrupted; the handler only sets _stop.
                ready = dict(poller.poll(_POLL_MS))
                if self.router in ready:
                    while True:
                        try:
                            frames = self.router.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_client(frames)
                for p in live:
                    if p.socket in ready and p.state != DEAD:
                        while p.socket.poll(0):
                            self._on_process(p, p.receive())
                self._tick()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Fail what is in flight, stop every process (no orphans), close sockets."""
        for req in self.requests.all():
            self._fail(req.rid, P.WORKER_DIED, "the node agent is shutting down")
        for proc in self.procs.values():
            proc.stop()
        self.procs.clear()
        self.router.close(linger=1000)
        self.ctx.term()
        log.info("node agent stopped")


def serve(cfg: AgentConfig) -> None:
    """Run an agent until SIGINT or SIGTERM."""
    agent = Agent(cfg)
    signal.signal(signal.SIGTERM, agent.request_stop)
    signal.signal(signal.SIGINT, agent.request_stop)
    agent.run()
