"""The node agent: the ROUTER socket of docs/worker-protocol.md and the
execution processes behind it.

It hears only clients holding its control-plane key: every frame is opened
by the gate (tiertp.worker.gate) before anything reads it, and every reply
is sealed in the client's session; a frame that does not open gets no reply.

One thread, one loop: poll the client socket and every execution process's
socket, handle what arrived, make the hand-offs the client told it to, then
a tick (keep-alive pings, death and hang detection, due restarts). Each
accepted request ends in exactly one terminal message (see
tiertp.worker.requests).

Processes: one warm execution process per aligned TP group at every
candidate TP level (`--tp-levels`; e.g. TP1 on each device, TP2 on each
pair). With more than one level, each device's model is loaded once into a
shared weight store (tiertp.worker.weight_stores) that all its processes
map. The active groups are the current plan's; the others sit paused.

Requests are routed to an active TP group (the submit's `group`, else where
the core's fallback rule puts them, `_scheduler.fallback_group`: the least
loaded non-decode group of the request's tier, else any group as best
effort); a group whose process is not ready yet holds them and sends them
when it is.

A plan that changes TP groups is a TP switch (tiertp.worker.switcher): the
groups it removes and adds fall into merges and splits
(tiertp.worker.layout_change), each run by the switching coordinator over
the processes' instances (tiertp.worker.remote_instance): pause, KV
migration, resume in the new group; waiting requests move as metadata. Each
request goes to the new group the plan's `moves` name for it (the client's
control loop decides), one the plan does not name to one over its devices. If
any part fails, the parts done are undone, the old assignments stay and the
plan is rejected with the reason.

Prefill -> decode hand-offs are the client's decisions (the gateway's
control loop, tiertp.worker.hand_offs): a `hand_off` names a running
request and the group to move it to, and the agent moves it (KV included)
with the same mechanism, the prefill group going on with its other
requests. A move it cannot make (the group is not active here or its
process is not ready, the request is not running, the KV move failed) is
answered `handed_off` with a typed failure, logged, and the request keeps
decoding where it is. Without a `hand_off` a request never moves: one whose
first token came from a `prefill` group decodes there to its end (e.g. a
client without a control loop, or a tier the plan gives no decode group).

Deadlines: a submit's `start_within_s` becomes a deadline on this process's
monotonic clock at its arrival (CLOCK_MONOTONIC is system-wide, so the
execution processes compare it with their own time.monotonic()). It goes
with the request to the process that queues it, again after a switch moves
it; whoever holds it when it passes (the process's batch policy, or the
agent while the process is not ready) sheds it with `slo_unattainable`.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from collections import defaultdict
from collections.abc import Iterable

import zmq

from tiertp import _scheduler
from tiertp.tp_group import TpGroup
from tiertp.worker import protocol as P
from tiertp.worker.config import AgentConfig, check_model_fits_tp_levels
from tiertp.worker.gate import Gate
from tiertp.worker.groups import aligned_groups
from tiertp.worker.hand_offs import Told, by_pair, refusal
from tiertp.worker.layout_change import layout_changes
from tiertp.worker.messages import ApplyPlan, Submit, parse_apply_plan, parse_cancel, parse_hand_off, parse_submit
from tiertp.worker.plan import PlanRejected, check_plan, initial_assignments
from tiertp.worker.process import DEAD, READY, ExecProcess
from tiertp.worker.remote_instance import RemoteInstance, RemoteOpFailed
from tiertp.worker.requests import InFlight, RequestTable
from tiertp.worker.runners import DEFAULT_RUNNER
from tiertp.worker.step_runner import ModelLimits
from tiertp.worker.switcher import ChangeFailed, Switcher
from tiertp.worker.weight_stores import close_stores, create_device_stores, write_store_handles

log = logging.getLogger(__name__)

_POLL_MS = 50
_MAX_RESTART_DELAY_S = 30.0


class Agent:
    """A node agent for `cfg`. `run` blocks until `request_stop` (SIGINT/SIGTERM)
    and always stops every execution process before returning."""

    def __init__(self, cfg: AgentConfig):
        check_model_fits_tp_levels(cfg.model, cfg.tp_levels)
        if cfg.key is None:
            raise ValueError("the agent needs a control-plane key (--key-file): it hears only clients holding it")
        self.cfg = cfg
        self.gate = Gate(cfg.key)
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
        # Switching: each ready process's instance, and the coordinator (made
        # at the first ready process: it hosts a store the ranks connect to).
        self.instances: dict[TpGroup, RemoteInstance] = {}
        self.switcher: Switcher | None = None
        self._hand_offs: list[Told] = []  # told by the client, made at the end of this loop pass
        # Reported in `stats`: TP switches applied / rolled back, requests handed off.
        self.moves = {"switches": 0, "rolled_back": 0, "hand_offs": 0, "handed_off_requests": 0}
        self.stores: dict = {}
        self._stores_arg: str | None = None
        if len(cfg.tp_levels) > 1 and _runner_name() == "instance":
            try:
                self.stores = create_device_stores(cfg.model, cfg.devices, cfg.tp_levels)
            except BaseException:
                self.router.close(linger=0)
                self.ctx.term()
                raise
            self._stores_arg = str(write_store_handles(self.stores, cfg.resolved_log_dir()))
        self.limits: ModelLimits | None = None  # the model's; known once a process is ready
        self._generation = 0
        self._start_failures: dict[TpGroup, int] = defaultdict(int)
        self._restart_at: dict[TpGroup, float] = {}
        self._stop = False

    # ---- processes -------------------------------------------------------

    def warm_groups(self) -> list[TpGroup]:
        """The groups that get a warm process: every aligned group at every TP level."""
        return aligned_groups(self.cfg.devices, list(self.cfg.tp_levels))

    def _start(self, group: TpGroup) -> None:
        self._generation += 1
        a = self.assign[group.first]
        self.instances.pop(group, None)
        self.procs[group] = ExecProcess(self.ctx, self.cfg, group, self._generation, a.batch_cap, a.token_cap,
                                        weight_stores=self._stores_arg)

    def _on_ready(self, proc: ExecProcess) -> None:
        self._start_failures[proc.group] = 0
        self.limits = self.limits or proc.limits
        a = self.assign[proc.group.first]
        # A plan may have changed the caps while the process was starting.
        proc.send({"type": "caps", "batch_cap": a.batch_cap, "token_cap": a.token_cap})
        if len(self.warm_groups()) > 1:  # something to switch or hand off to
            self._register_instance(proc)
        for req in self.requests.on_group(proc.group):
            if not req.sent:
                self._send_to_process(req, proc)

    def _register_instance(self, proc: ExecProcess) -> None:
        """Make `proc`'s instance a switching participant (TP switches, hand-offs)."""
        try:
            inst = RemoteInstance(proc, self.cfg.model, self._on_process, self._max_tokens)
            if self.switcher is None:
                self.switcher = Switcher(self._on_moved, self._on_dropped, self._kv_tokens)
            self.switcher.warm(inst)
        except Exception as e:  # noqa: BLE001 - it still serves; plans needing it are rejected
            log.warning("device %d TP%d: not available for TP switches: %s", proc.group.first, proc.group.tp, e)
            return
        self.instances[proc.group] = inst

    def _on_death(self, proc: ExecProcess, reason: str) -> None:
        group = proc.group
        was_ready = proc.limits is not None
        self.instances.pop(group, None)
        log.error("device %d TP%d: %s; restarting it", group.first, group.tp, reason)
        where = f"device {group.first} (TP{group.tp} group {group.as_list()})"
        for req in self.requests.on_group(group):
            if req.sent and req.process_generation == proc.generation:
                self._fail(req.rid, P.WORKER_DIED, f"{where}: {reason}; the request was running there and is lost")
        if was_ready:
            delay = 0.0
        else:
            self._start_failures[group] += 1
            n = self._start_failures[group]
            delay = min(2.0 ** n, _MAX_RESTART_DELAY_S)
            if n >= self.cfg.max_start_failures:
                for req in self.requests.on_group(group):
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
        self._shed_held(now)
        self.gate.forget_idle()

    # ---- requests --------------------------------------------------------

    def _to_client(self, client: bytes, msg: dict) -> None:
        frame = self.gate.seal(client, P.encode(msg))
        if frame is None:  # its session was forgotten (idle): it would not open the reply anyway
            log.debug("a message of type %s to a client without a session dropped", msg.get("type"))
            return
        self.router.send_multipart([client, frame])

    def _fail(self, rid: int, code: str, message: str) -> None:
        req = self.requests.finish(rid)
        if req is not None:
            self._to_client(req.client, P.error(code, message, req.submit.id))

    def _shed(self, req: InFlight, why: str) -> None:
        """Fail `req` with slo_unattainable: its deadline passed before it could start prefilling."""
        s = req.submit
        self._fail(req.rid, P.SLO_UNATTAINABLE, f"submit {s.id}: not started within start_within_s = "
                   f"{s.start_within_s:g} s of its arrival ({why}); it can no longer meet its TTFT")

    def _shed_held(self, now: float) -> None:
        """Shed the requests held here (their process is not ready) past their deadline: a process
        may take many seconds to start, and the client must not wait for it to learn that."""
        for req in self.requests.held():
            if req.deadline <= now:
                self._shed(req, f"the TP{req.group.tp} process of group {req.group.as_list()} was not ready")

    def _check_limits(self, s: Submit, limits: ModelLimits) -> str | None:
        bad = [t for t in s.input_ids if t >= limits.vocab_size]
        if bad:
            return f"submit {s.id}: token id {bad[0]} is out of the model's vocabulary (size {limits.vocab_size})"
        total = len(s.input_ids) + s.max_tokens
        if total > limits.max_request_tokens:
            return (f"submit {s.id}: {len(s.input_ids)} prompt tokens + max_tokens {s.max_tokens} = {total} "
                    f"exceeds the {limits.max_request_tokens} tokens a request may hold on this worker")
        return None

    def _send_to_process(self, req: InFlight, proc: ExecProcess) -> None:
        problem = self._check_limits(req.submit, proc.limits)
        if problem:
            self._fail(req.rid, P.BAD_REQUEST, problem)
            return
        s = req.submit
        proc.send({"type": "add", "rid": req.rid, "input_ids": list(s.input_ids), "max_tokens": s.max_tokens,
                   "temperature": s.sampling.temperature, "top_p": s.sampling.top_p, "seed": s.sampling.seed,
                   "stop_token_ids": list(s.sampling.stop_token_ids), "cls": s.cls, "deadline": req.deadline})
        req.sent = True
        req.process_generation = proc.generation

    def _active_groups(self) -> list[TpGroup]:
        return sorted({a.tp_group for a in self.assign.values()})

    def _load(self, group: TpGroup) -> int:
        """Requests in flight on `group`: the agent's own count (a process's report lags behind)."""
        return len(self.requests.on_group(group))

    def _route(self, s: Submit) -> TpGroup:
        active = self._active_groups()
        if s.group is not None:
            if s.group in active:
                return s.group
            # The gateway's plan may not be the one running here (this agent
            # rejected it, e.g. a TP switch rolled back): route by tier instead.
            log.info("submit %d: group %s is not active here (active: %s); routing by tier", s.id,
                     s.group.as_list(), [g.as_list() for g in active])
        return self._fallback(s.tier, active)

    def _fallback(self, tier: str, active: Iterable[TpGroup], over: TpGroup | None = None) -> TpGroup:
        """Where the core's rule (`_scheduler.fallback_group`) puts a request of `tier` that the
        gateway's placement cannot put here, among the `active` groups; `over`: the group a plan
        change stopped under it."""
        groups = []
        for g in sorted(active):
            a = self.assign.get(g.first)  # none: a group no plan has given a tier
            planned = None if a is None else a.tier
            groups.append(_scheduler.NodeGroup(g.first, g.tp, its_tier=planned == tier, unplanned=planned is None,
                                               decode_only=a is not None and a.role == "decode", load=self._load(g)))
        picked = _scheduler.fallback_group(groups, None if over is None else (over.first, over.tp))
        if picked is None:
            raise RuntimeError("the agent runs no TP group to place a request on")
        return TpGroup(*picked)

    def _on_submit(self, client: bytes, msg: dict) -> None:
        arrived = time.monotonic()  # start_within_s counts from here
        s = parse_submit(msg)
        group = self._route(s)
        if self.limits is not None and (problem := self._check_limits(s, self.limits)):
            raise P.ProtocolError(problem, request_id=s.id)
        try:
            req = self.requests.add(client, s, group, s.deadline(arrived))
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
        proc = self.procs.get(req.group)
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
            old_groups, new_groups = set(self._active_groups()), {a.tp_group for a in new.values()}
            changes = layout_changes(old_groups, new_groups)
            self._check_switchable(changes)
        except (P.ProtocolError, PlanRejected) as e:
            log.warning("plan %d rejected: %s", plan_id, e)
            reply(False, str(e))
            return
        placed = self._placed(client, plan)
        done = []
        try:
            for change in changes:
                self.switcher.apply(change, self.instances, placed)
                done.append(change)
        except (ChangeFailed, RemoteOpFailed) as e:
            log.warning("plan %d: TP switch %s failed: %s", plan_id, change.describe(), e)
            for undo in reversed(done):
                try:
                    self.switcher.apply(undo.reversed(), self.instances)
                except (ChangeFailed, RemoteOpFailed) as e2:
                    log.error("plan %d: undoing %s failed: %s", plan_id, undo.describe(), e2)
            self._settle(old_groups)
            self.moves["rolled_back"] += 1
            reply(False, f"TP switch {change.describe()} failed and was rolled back; the old assignments stay: {e}")
            return
        for group in sorted(new_groups):
            a, proc = new[group.first], self.procs.get(group)
            old = self.assign[group.first]
            caps_changed = (a.batch_cap, a.token_cap) != (old.batch_cap, old.token_cap) or group not in old_groups
            if proc is not None and proc.state == READY and caps_changed:
                proc.send({"type": "caps", "batch_cap": a.batch_cap, "token_cap": a.token_cap})
        self.assign = new
        self.plan_id = plan_id
        if changes:
            self._settle(new_groups, placed)
            self.moves["switches"] += len(changes)
        reply(True, None)

    def _check_switchable(self, changes) -> None:
        """PlanRejected unless every group a switch moves requests into is ready to take them."""
        for change in changes:
            for g in change.dests:
                proc = self.procs.get(g)
                if proc is None or proc.state != READY:
                    state = "not started" if proc is None else proc.state
                    raise PlanRejected(f"TP switch {change.describe()}: the TP{g.tp} process of group {g.as_list()} "
                                       f"is not ready ({state})")
                if g not in self.instances:
                    raise PlanRejected(f"TP switch {change.describe()}: the TP{g.tp} process of group {g.as_list()} "
                                       "cannot take part in switches (see the agent log)")

    # ---- switching -------------------------------------------------------

    def _max_tokens(self, rid: int) -> int:
        req = self.requests.get(rid)
        return req.submit.max_tokens if req is not None else 1

    def _kv_tokens(self, rid: int) -> int:
        req = self.requests.get(rid)
        return len(req.submit.input_ids) + req.generated if req is not None else 0

    def _on_moved(self, rids: list[int], group: TpGroup) -> None:
        proc = self.procs[group]
        for rid in rids:
            req = self.requests.get(rid)
            if req is not None:
                req.group, req.sent, req.process_generation = group, True, proc.generation

    def _on_dropped(self, rids: list[int], group: TpGroup) -> None:
        for rid in rids:
            req = self.requests.get(rid)
            if req is not None and req.group == group:
                req.sent = False

    def _placed(self, client: bytes, plan: ApplyPlan) -> dict[int, TpGroup]:
        """The plan's moves, by rid: where the control loop settled each request of a
        group the plan stops (`ControlLoop::window`)."""
        out = {}
        for m in plan.moves:
            req = self.requests.lookup(client, m.id)
            if req is not None:
                out[req.rid] = m.tp_group
        return out

    def _settle(self, active: set[TpGroup], placed: dict[int, TpGroup] | None = None) -> None:
        """After a switch: instances of active groups (or holding requests) run, the others
        pause; requests whose group is no longer active go where the plan placed them, or,
        if it did not name them, where the core's fallback rule puts them (`_fallback`)."""
        holding = {r.group for r in self.requests.all() if r.sent}
        for g, inst in list(self.instances.items()):
            run = g in active or g in holding
            try:
                if run and inst.paused:
                    inst.resume()
                elif not run and not inst.paused:
                    inst.pause()
            except RemoteOpFailed as e:  # a dead process: the tick restarts it
                log.error("device %d TP%d: %s", g.first, g.tp, e)
        placed = placed or {}
        for req in self.requests.all():
            if req.sent or req.group in active:
                continue
            if (g := placed.get(req.rid)) in active:
                req.group = g
                continue
            req.group = self._fallback(req.submit.tier, active, over=req.group)
        for req in self.requests.all():
            proc = self.procs.get(req.group)
            if not req.sent and proc is not None and proc.state == READY:
                self._send_to_process(req, proc)

    # ---- hand-offs (the client's decisions) --------------------------------

    def _hand_off_refusal(self, req: InFlight | None, told_id: int, dest: TpGroup) -> tuple[str, str] | None:
        return refusal(req, told_id, dest, self._active_groups(), self.instances)

    def _on_hand_off(self, client: bytes, msg: dict) -> None:
        h = parse_hand_off(msg)
        req = self.requests.lookup(client, h.id)
        if (problem := self._hand_off_refusal(req, h.id, h.group)) is not None:
            self._answer_hand_off(client, h.id, h.group, *problem)
        elif req.group == h.group:
            self._answer_hand_off(client, h.id, h.group)  # already there: nothing to move
        else:
            self._hand_offs.append(Told(client, h.id, req.rid, h.group))

    def _answer_hand_off(self, client: bytes, told_id: int, dest: TpGroup, failure: str | None = None,
                         message: str | None = None) -> None:
        if failure is not None and failure != P.NOT_RUNNING:  # not running: it ended first, nothing lost
            log.warning("%s; the request decodes where it is", message)
        self._to_client(client, P.handed_off(told_id, dest.as_list(), failure, message))

    def _run_hand_offs(self) -> None:
        """Make the hand-offs told during this loop pass: checked again (a plan, a death or the
        request's end may have come since), then one KV move per (source, destination) pair."""
        told, self._hand_offs = self._hand_offs, []
        ready = []
        for t in told:
            req = self.requests.get(t.rid)
            if (problem := self._hand_off_refusal(req, t.id, t.dest)) is not None:
                self._answer_hand_off(t.client, t.id, t.dest, *problem)
            elif req.group == t.dest:  # a TP switch took it there meanwhile
                self._answer_hand_off(t.client, t.id, t.dest)
            else:
                ready.append((req, t))
        for (src_group, dest_group), pair in by_pair(ready).items():
            rids = [t.rid for t in pair]
            try:
                moved = set(self.switcher.hand_off(src_group, self.instances[src_group], rids, dest_group,
                                                   self.instances[dest_group]))
            except (ChangeFailed, RemoteOpFailed) as e:
                for t in pair:
                    self._answer_hand_off(t.client, t.id, dest_group, P.MOVE_FAILED,
                                          f"hand_off {t.id}: moving its KV from TP{src_group.tp} group "
                                          f"{src_group.as_list()} to TP{dest_group.tp} group {dest_group.as_list()} "
                                          f"failed and was rolled back: {e}")
                continue
            if moved:
                self.moves["hand_offs"] += 1
                self.moves["handed_off_requests"] += len(moved)
            for t in pair:
                if t.rid in moved:
                    self._answer_hand_off(t.client, t.id, dest_group)
                else:
                    self._answer_hand_off(t.client, t.id, dest_group, P.NOT_RUNNING,
                                          f"hand_off {t.id}: the request finished before its KV could move")

    def _stats(self) -> dict:
        devices = []
        for d, a in sorted(self.assign.items()):
            proc = self.procs.get(a.tp_group)
            load = proc.load if proc is not None and proc.state == READY else {"running": 0, "waiting": 0,
                                                                              "kv_used_tokens": 0}
            held = sum(1 for r in self.requests.on_group(a.tp_group) if not r.sent)
            devices.append({"device": d, "role": a.role, "tier": a.tier, "tp_group": a.tp_group.as_list(),
                            "running": load["running"], "waiting": load["waiting"] + held,
                            "kv_used_tokens": load["kv_used_tokens"],
                            "kv_capacity_tokens": self.cfg.max_total_tokens,
                            # The gateway plans only over ready devices (docs/worker-protocol.md).
                            "state": proc.state if proc is not None else DEAD})
        processes = [{"tp_group": g.as_list(), "state": p.state, "active": g in self._active_groups(),
                      "switchable": g in self.instances} for g, p in sorted(self.procs.items())]
        stats = {"type": P.STATS, "devices": devices, "plan_id": self.plan_id, "moves": dict(self.moves),
                 "processes": processes}
        if self.limits is not None:
            # The gateway refuses a request over the context itself, in the client's terms.
            stats["max_model_len"] = self.limits.max_request_tokens
        return stats

    def _receive(self, frames: list[zmq.Frame]) -> None:
        """A ROUTER message: handled if the gate opens it, else left unanswered."""
        peer = frames[0].bytes
        try:
            address = frames[-1].get("Peer-Address")
        except zmq.ZMQError:
            address = "an unknown address"
        plaintext = self.gate.open(peer, [f.bytes for f in frames[1:]], address)
        if plaintext is not None:
            self._on_client([peer, plaintext])

    def _on_client(self, frames: list[bytes]) -> None:
        """A client's message, opened: [its connection, the msgpack map]."""
        client, body = frames
        try:
            msg = P.decode(body)
            kind = msg["type"]
            if kind == P.SUBMIT:
                self._on_submit(client, msg)
            elif kind == P.CANCEL:
                self._on_cancel(client, msg)
            elif kind == P.HAND_OFF:
                self._on_hand_off(client, msg)
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
        elif kind == "expired":
            self._on_expired(proc, msg["rids"])
        elif kind not in ("pong", "load", "exiting", "op_done"):  # op_done: an op that timed out
            log.error("device %d: unknown message type %r from the execution process", proc.group.first, kind)

    def _on_expired(self, proc: ExecProcess, rids: list[int]) -> None:
        """`proc`'s batch policy shed these waiting requests: their deadline passed before a batch took them."""
        why = f"still queued on device {proc.group.first} TP{proc.group.tp}"
        for rid in rids:
            req = self.requests.get(rid)
            if req is not None and req.process_generation == proc.generation:  # else: already ended
                self._shed(req, why)

    # ---- loop ------------------------------------------------------------

    def request_stop(self, *_args) -> None:
        self._stop = True

    def run(self) -> None:
        log.info("node agent on %s: %d device(s), model %s, TP levels %s", self.cfg.bind, self.cfg.devices,
                 self.cfg.model, list(self.cfg.tp_levels))
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
                            frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._receive(frames)
                for p in live:
                    if p.socket in ready and p.state != DEAD:
                        while p.socket.poll(0):
                            self._on_process(p, p.receive())
                self._run_hand_offs()
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
        self.instances.clear()
        if self.switcher is not None:
            self.switcher.close()
        close_stores(self.stores)
        self.router.close(linger=1000)
        self.ctx.term()
        log.info("node agent stopped")


def _runner_name() -> str:
    """The execution processes' step runner (tiertp.worker.runners; they read the same variable)."""
    return os.environ.get("TIERTP_STEP_RUNNER") or DEFAULT_RUNNER


def serve(cfg: AgentConfig) -> None:
    """Run an agent until SIGINT or SIGTERM."""
    agent = Agent(cfg)
    signal.signal(signal.SIGTERM, agent.request_stop)
    signal.signal(signal.SIGINT, agent.request_stop)
    agent.run()
