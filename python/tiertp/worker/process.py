"""One execution process as the agent sees it: start, messages, liveness, kill.

`ExecProcess` owns one incarnation's ZeroMQ PAIR socket (bound by the agent
on a fresh ipc path per start, so nothing from a dead incarnation can reach
its successor) and the `subprocess.Popen` of ``python -m
tiertp.worker.executor``, started in its own session so that killing its
process group also kills SGLang's children. States: STARTING (until its
``ready``), READY, DEAD. The agent polls `socket`, calls `check` every tick,
and restarts a DEAD process.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import zmq

import tiertp
from tiertp.engine.isolated import kill_group
from tiertp.tp_group import TpGroup
from tiertp.worker import protocol as P
from tiertp.worker.config import AgentConfig
from tiertp.worker.step_runner import ModelLimits

log = logging.getLogger(__name__)

STARTING, READY, DEAD = "starting", "ready", "dead"


class ExecProcess:
    """One execution process (one incarnation) for one TP group.

    Contract: `send` only when READY, and it never blocks (a message the
    process cannot take is reported by the next `check`); `check` returns a
    reason string once when the process is found dead or hung (it is then
    killed and DEAD);
    `stop` ends it (asks politely, then kills its group) and is idempotent.
    """

    def __init__(self, ctx: zmq.Context, cfg: AgentConfig, group: TpGroup, generation: int, batch_cap: int,
                 token_cap: int, weight_stores: str | None = None):
        self.group = group
        self.generation = generation
        self.state = STARTING
        self.limits: ModelLimits | None = None
        self.exit_note: str | None = None  # the process's own last word on why it exits
        self.load = {"running": 0, "waiting": 0, "kv_used_tokens": 0}
        log_dir = cfg.resolved_log_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"dev{group.first}-tp{group.tp}-gen{generation}"
        self.log_path = log_dir / f"{name}.log"
        self.endpoint = f"ipc://{log_dir}/{name}.sock"
        self.socket = ctx.socket(zmq.PAIR)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(self.endpoint)
        self._cfg = cfg
        self._refused = False  # a message could not be handed to the process (`send`)
        self._started = self._last_heard = self._last_ping = time.monotonic()
        env = dict(os.environ)
        # The child imports tiertp from where the agent did (checkout or site-packages).
        pkg_root = str(Path(tiertp.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "tiertp.worker.executor", "--endpoint", self.endpoint, "--model", cfg.model,
               "--first-device", str(group.first), "--tp", str(group.tp),
               "--max-total-tokens", str(cfg.max_total_tokens), "--batch-cap", str(batch_cap),
               "--token-cap", str(token_cap), "--engine-args", json.dumps(cfg.extra_engine_args),
               "--cores-per-device", str(cfg.resolved_cores_per_device())]
        if weight_stores:  # the node's shared weight stores (tiertp.worker.weight_stores)
            cmd += ["--weight-stores", weight_stores]
        with open(self.log_path, "ab") as logf:
            self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)
        log.info("device %d TP%d: started execution process pid %d (log %s)", group.first, group.tp,
                 self.popen.pid, self.log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def send(self, msg: dict) -> None:
        assert self.state == READY, self.state
        try:
            # Never block the agent's loop: a PAIR socket whose peer is gone
            # blocks a send until a peer comes back, which a dead process
            # never does. A message the process cannot take means it died (or
            # stopped reading) since the last check; `check` reports it.
            self.socket.send(P.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            self._refused = True

    def receive(self) -> dict:
        """The next message (call when `socket` is readable); updates liveness and load."""
        msg = P.decode(self.socket.recv())
        self._last_heard = time.monotonic()
        if msg["type"] == "ready":
            self.state = READY
            self.limits = ModelLimits(msg["vocab_size"], msg["max_request_tokens"], msg["kv_capacity_tokens"])
            log.info("device %d TP%d: execution process pid %d ready", self.group.first, self.group.tp, self.pid)
        if msg["type"] == "exiting":
            self.exit_note = str(msg.get("reason"))
        if msg["type"] in ("tokens", "pong", "load", "expired"):
            self.load = {k: msg[k] for k in self.load}
        return msg

    def check(self) -> str | None:
        """Liveness check, one tick: pings a READY process every keepalive
        period; returns why the process is dead (and kills it) or None."""
        if self.state == DEAD:
            return None
        now = time.monotonic()
        reason = None
        rc = self.popen.poll()
        if rc is not None and self.socket.poll(0):
            return None  # read its last messages (tokens, `exiting`) first: next tick
        if rc is not None:
            reason = f"execution process pid {self.pid} exited with code {rc}"
            if self.exit_note:
                reason += f" ({self.exit_note})"
        elif self._refused:
            reason = f"execution process pid {self.pid} took no message: its end of the socket is gone or full"
        elif self.state == STARTING and now - self._started > self._cfg.start_timeout_s:
            reason = f"execution process pid {self.pid} was not ready after {self._cfg.start_timeout_s:.0f} s"
        elif self.state == READY and now - self._last_heard > self._cfg.hang_timeout_s:
            reason = f"execution process pid {self.pid} did not answer for {self._cfg.hang_timeout_s:.0f} s"
        elif self.state == READY and now - self._last_ping >= self._cfg.keepalive_s:
            self._last_ping = now
            self.send({"type": "ping"})
        if reason is not None:
            self._kill()
        return reason

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 5.0) -> None:
        if self.state == DEAD:
            return
        if self.state == READY:
            try:
                self.socket.send(P.encode({"type": "shutdown"}), zmq.NOBLOCK)
                self.popen.wait(timeout=grace_s)
            except (zmq.ZMQError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def _kill(self) -> None:
        self.state = DEAD
        kill_group(self.popen)  # the whole group: SGLang's children too
        self.socket.close(linger=0)
        try:
            os.unlink(self.endpoint[len("ipc://"):])
        except OSError:
            pass
