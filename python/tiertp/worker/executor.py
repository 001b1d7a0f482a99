"""The execution process: one model replica on one TP group, driven by the agent.

Run as ``python -m tiertp.worker.executor`` by tiertp.worker.process, in its
own session (SGLang kills its whole process tree when a child fails, and
the agent must be able to kill this process and SGLang's children as one
group). It connects a ZeroMQ PAIR socket to the agent and loops:

1. handle the agent's messages (between iterations only):
   ``add`` (a request), ``cancel``, ``caps`` (batch/token caps), ``ping``,
   ``shutdown``, and ``op`` (pause, export, adopt, ... for TP switches and
   hand-offs: tiertp.worker.switch_ops; a paused process does not iterate);
2. shed the waiting requests whose deadline passed (`take_expired`: they can
   no longer start in time to meet their TTFT, so they never take a batch
   slot), then ask the Rust batch policy (`tiertp._scheduler.BatchPolicy`)
   which waiting requests join the running batch (`next_batch(running)`);
3. run one iteration for the running batch (`StepRunner.step`) and send the
   new tokens to the agent in one ``tokens`` message; requests that finished
   (or were cancelled) are released to the runner, which frees their KV.

The runner is chosen with ``--runner`` (tiertp.worker.runners.RUNNERS; the
default, or the TIERTP_STEP_RUNNER environment variable when set). The
process's requests (waiting, running, parked) live in one BatchState
(tiertp.worker.batch_state), which the loop and the switch ops change
through its methods only.

An ``add`` carries the request's ``deadline``: the agent's time.monotonic()
by which it must start (inf: none). CLOCK_MONOTONIC is system-wide on
Linux, so this process compares it with its own time.monotonic().

To the agent: ``ready`` {pid, vocab_size, max_request_tokens,
kv_capacity_tokens}; ``tokens`` {items: [{rid, token, finished,
finish_reason}], running, waiting, kv_used_tokens}; ``pong`` and ``load``
(after a cancel) {running, waiting, kv_used_tokens}; ``expired`` {rids,
running, waiting, kv_used_tokens}: waiting requests shed past their
deadline (the agent fails them as slo_unattainable); ``failed`` {rids, message} when an iteration
raised (the process then exits; the agent fails the rest as worker_died);
``exiting`` {reason} just before it exits, when it knows why (an SGLang
child process died, an exception).

The process exits when the agent says ``shutdown``, on SIGTERM/SIGINT, or
when the agent dies (parent-death signal, and a parent-pid check).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback

import psutil
import zmq

from tiertp.execution.process_util import die_with_parent
from tiertp.execution.records import Sampling
from tiertp.tp_group import TpGroup
from tiertp.worker import protocol as P
from tiertp.worker.batch_state import BatchState
from tiertp.worker.exec_request import ExecRequest
from tiertp.worker.runners import DEFAULT_RUNNER, RUNNERS, make_runner
from tiertp.worker.step_runner import RunnerDied, StepRunner
from tiertp.worker.switch_ops import SwitchOps
from tiertp.worker.weight_stores import read_store_handles

_IDLE_POLL_MS = 200
_WATCH_S = 0.5
# Why this process is about to exit, when it knows (told to the agent in `exiting`).
_exit_reason: list[str] = []


class ExecutionLoop:
    """The loop above, over a connected socket and a started runner; `requests`
    (a BatchState) holds the process's requests."""

    def __init__(self, sock: zmq.Socket, runner: StepRunner, batch_cap: int, token_cap: int,
                 kv_capacity_tokens: int | None = None):
        self.sock = sock
        self.runner = runner
        self.requests = BatchState(runner, batch_cap, token_cap, kv_capacity_tokens)
        self.parent = os.getppid()
        self.stop = False
        self.ops = SwitchOps(self.requests, self.send, self.send_load)

    def send(self, msg: dict) -> None:
        self.sock.send(P.encode(msg))

    def send_load(self) -> None:
        self.send({"type": "load", **self.requests.load()})

    def _handle(self, msg: dict) -> None:
        kind = msg["type"]
        if kind == "add":
            sampling = Sampling(msg["temperature"], msg["top_p"], msg["seed"], tuple(msg["stop_token_ids"]))
            r = ExecRequest(msg["rid"], list(msg["input_ids"]), msg["max_tokens"], sampling)
            self.requests.add(r, msg["cls"], msg["deadline"])
        elif kind == "cancel":
            self.requests.cancel(msg["rid"])
            # The agent's stats come from this process's reports; without this
            # one they would show the cancelled request until the next ping.
            self.send_load()
        elif kind == "caps":
            self.requests.set_caps(msg["batch_cap"], msg["token_cap"])
        elif kind == "ping":
            self.send({"type": "pong", **self.requests.load()})
        elif kind == "op":
            self.send(self.ops.handle(msg))
        elif kind == "shutdown":
            self.stop = True
        else:  # the agent is the only peer; an unknown type is a bug there
            raise RuntimeError(f"execution process got unknown message type {kind!r}")

    def run(self) -> None:
        requests = self.requests
        while not self.stop:
            busy = requests.has_work() and not requests.paused
            timeout = 0 if busy else _IDLE_POLL_MS
            while self.sock.poll(timeout):
                self._handle(P.decode(self.sock.recv()))
                timeout = 0
            if self.stop or os.getppid() != self.parent:  # agent gone: never outlive it
                return
            if requests.paused:
                continue
            self._schedule(time.monotonic())
            if requests.running:
                self._iterate()

    def _schedule(self, now: float) -> None:
        """Shed the waiting requests past their deadline (the agent fails them:
        each one still gets its terminal message), then admit the next ones into the batch."""
        expired = self.requests.shed_expired(now)
        if expired:
            self.send({"type": "expired", "rids": expired, **self.requests.load()})
        self.requests.admit()

    def _iterate(self) -> None:
        batch = list(self.requests.running)
        try:
            items = self.requests.step()
        except RunnerDied as e:  # not a failed iteration: this worker is dead
            _exit_reason.append(str(e))
            raise
        except Exception as e:
            self.send({"type": "failed", "rids": batch,
                       "message": f"model iteration failed: {type(e).__name__}: {e}"})
            raise
        if items:
            self.send({"type": "tokens", "items": items, **self.requests.load()})


def _watch_engine_children() -> None:
    """Exit (SIGTERM to this process) when one of the runner's child processes
    (SGLang's, or the TP instance's rank processes) dies.

    Why: SGLang's own path is a child that notices a failure sending SIGQUIT
    to this process, whose handler kills the tree (the agent then sees exit
    code -9). When no child notices, `Engine.generate` would wait forever and
    the agent would only see a hang after its hang timeout; this watcher is
    the fallback that turns a dead child into a dead process at once (the
    TP instance notices a dead rank itself, while it waits for an answer).
    """
    children = psutil.Process().children(recursive=True)

    def watch():
        while True:
            for c in children:
                try:
                    dead = c.status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    dead = True
                if dead:
                    _exit_reason.append(f"model child process {c.pid} ({_name(c)}) died")
                    print(_exit_reason[-1], file=sys.stderr, flush=True)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
            time.sleep(_WATCH_S)

    threading.Thread(target=watch, name="engine-children-watch", daemon=True).start()


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tiertp.worker.executor")
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--first-device", type=int, required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--max-total-tokens", type=int, required=True)
    ap.add_argument("--batch-cap", type=int, required=True)
    ap.add_argument("--token-cap", type=int, required=True)
    ap.add_argument("--engine-args", default="{}", help="JSON: more SGLang Engine/server keyword arguments")
    ap.add_argument("--cores-per-device", type=int, default=None,
                    help="CPU: cores each logical device owns (device d: core group d); default: all cores")
    ap.add_argument("--weight-stores", default=None,
                    help="file with a pickle of {device: StoreHandle}: bind the model to the node's shared weight "
                         "stores (tiertp.weights) instead of loading it (one copy per device for all TP levels)")
    ap.add_argument("--runner", choices=RUNNERS, default=os.environ.get("TIERTP_STEP_RUNNER") or DEFAULT_RUNNER,
                    help=f"step runner (default {DEFAULT_RUNNER}, or $TIERTP_STEP_RUNNER)")
    args = ap.parse_args(argv)
    # The kernel sends SIGTERM when the agent dies, even by SIGKILL; the
    # parent-pid check in the loop covers systems without it.
    die_with_parent()
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGINT, _raise_exit)
    group = TpGroup(args.first_device, args.tp)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(args.endpoint)
    runner = make_runner(args.runner, args.model, group, args.max_total_tokens, json.loads(args.engine_args),
                         cores_per_device=args.cores_per_device,
                         weight_stores=read_store_handles(args.weight_stores) if args.weight_stores else None)
    code = 0
    try:
        limits = runner.start()
        # SGLang's Engine sets signal handlers of its own; ours decide how this process ends.
        signal.signal(signal.SIGTERM, _raise_exit)
        signal.signal(signal.SIGINT, _raise_exit)
        _watch_engine_children()
        sock.send(P.encode({"type": "ready", "pid": os.getpid(), "vocab_size": limits.vocab_size,
                            "max_request_tokens": limits.max_request_tokens,
                            "kv_capacity_tokens": limits.kv_capacity_tokens}))
        ExecutionLoop(sock, runner, args.batch_cap, args.token_cap, limits.kv_capacity_tokens).run()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:
        traceback.print_exc()
        _exit_reason.append(f"{type(e).__name__}: {e}")
        code = 1
    finally:
        if _exit_reason:
            try:
                sock.send(P.encode({"type": "exiting", "reason": _exit_reason[0]}), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        if code == 0:  # otherwise SGLang may be half dead; the group kill below ends it
            try:
                runner.close()
            except Exception:
                traceback.print_exc()
        sock.close()  # lingers up to 1 s so `exiting` reaches the agent
        sys.stdout.flush()
        sys.stderr.flush()
        # SGLang's children share this process group (the agent started it in its
        # own session); take them along, then skip interpreter teardown, which
        # SGLang's atexit hooks can hang.
        if os.getpgid(0) == os.getpid():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(0, signal.SIGTERM)
        os._exit(code)


if __name__ == "__main__":
    main()
