"""`tiertp serve`: the node agent and the OpenAI-compatible gateway on this machine.

Starts `tiertp worker` (one SGLang execution process per logical device, on
CPU) as a subprocess, waits until it answers a ping and every device has
served a one-token warm-up request, then runs the gateway (Rust, in this
process) pointed at it: tiers and their API keys and limits from the tier
file, the control loop planning over the workers' devices with the profile
(--profile; by default this machine's, measured once and cached) at the TP
levels the workers run (--tp-levels: with more than one, every window's plan
may merge or split devices' TP groups, and the agent switches its warm
processes in milliseconds). Prints the URL, each tier's API
key and how to call it (curl, openai SDK), serves until SIGINT (Ctrl-C) or
SIGTERM, then stops the gateway, the agent and every execution process. With
no options it serves SmolLM2-135M with the embedded tiers on
http://127.0.0.1:8000. Agents on other machines: `tiertp gateway`.

The agent hears only the gateway: serve writes a fresh control-plane key to
its private temporary directory (mode 0700) and gives it to both (--key-file
names one to use instead, e.g. to ask the agent for its stats meanwhile).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tiertp.commands.banner import first_tier
from tiertp.commands.gateway_options import GatewaySettings, ServeInputError, add_gateway_options, gateway_settings
from tiertp.commands.gateway_runner import Stop, serve_gateway, stop_on_signals
from tiertp.commands.keys import add_key_file_argument
from tiertp.profile_source import MEASURED
from tiertp.worker.config import AgentConfig
from tiertp.ports import free_port

if TYPE_CHECKING:
    from tiertp.worker.seal import ControlKey

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI API: gateway + node agent on this machine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=1, help="logical devices (one execution process each; default 1)")
    add_gateway_options(
        p, model_help="",
        tp_levels_help="candidate TP levels, e.g. 1,2 (powers of two, at most --devices, that split the "
                       "model's heads): the agent keeps a warm process per aligned group at each level and "
                       "the planner may switch between them every window (default: 1, no switching)",
        profile_default=MEASURED,
        profile_help=f", or '{MEASURED}': this machine's, measured once with `tiertp profile --quick` at these "
                     f"TP levels (about a minute per level) and cached by model, device and TP levels")
    p.add_argument("--worker-port", type=int, default=0,
                   help="loopback TCP port of the agent's ZeroMQ socket (0: a free one)")
    p.add_argument("--ready-timeout", type=float, default=600.0,
                   help="seconds to wait for the agent and its engines (default 600)")
    p.add_argument("--log-dir", type=Path, default=None, help="execution process logs (default: a temp dir)")
    add_key_file_argument(
        p, "the control-plane key the agent and the gateway share (default: a fresh one in a private "
           "temp dir); give one to talk to the agent yourself (`tiertp keys FILE` makes one)")
    p.set_defaults(func=run)




class AgentProcess:
    """The `tiertp worker` subprocess (own session) and its execution processes."""

    def __init__(self, model: str, devices: int, tp_levels: list[int], endpoint: str, log_dir: Path,
                 key_file: Path, key: ControlKey):
        self.endpoint = endpoint
        self.log_dir = log_dir
        self.key = key
        cmd = [sys.executable, "-m", "tiertp.cli", "worker", "--bind", endpoint, "--model", model,
               "--devices", str(devices), "--tp-levels", ",".join(map(str, tp_levels)), "--log-dir", str(log_dir),
               "--key-file", str(key_file)]
        log.info("starting the agent: %s", " ".join(cmd))
        self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, tier: str, devices: int, timeout_s: float, stop: Stop) -> None:
        """Ping until pong, then one warm-up request per device; RuntimeError if
        the agent dies, a device fails to serve, or the time runs out."""
        import zmq

        from tiertp.worker import protocol as P
        from tiertp.worker.agent_client import AgentClient

        deadline = time.monotonic() + timeout_s
        ctx = zmq.Context()
        conn = AgentClient(ctx, self.endpoint, self.key)
        try:
            def recv_until(pred, what: str) -> dict:
                while True:
                    if stop.is_set():
                        raise KeyboardInterrupt
                    if self.popen.poll() is not None:
                        raise RuntimeError(f"the agent exited with code {self.popen.returncode} while {what}")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError(f"timed out after {timeout_s:.0f}s {what} (--ready-timeout)")
                    if conn.poll(int(min(left, 0.5) * 1000)):
                        msg = conn.recv()
                        if pred(msg):
                            return msg
                    elif what.startswith("waiting for the agent"):
                        conn.send({"type": P.PING})

            conn.send({"type": P.PING})
            recv_until(lambda m: m["type"] == P.PONG, "waiting for the agent to answer a ping")
            log.info("agent is up; warming up %d device(s) (engine start may take a minute)", devices)
            for d in range(devices):
                conn.send({"type": P.SUBMIT, "id": d + 1, "tier": tier, "input_ids": [1, 2, 3],
                           "sampling": {"max_tokens": 1, "temperature": 0.0, "top_p": 1.0,
                                        "seed": None, "stop_token_ids": []},
                           "class": "best_effort", "group": [d, 1]})
            done: set[int] = set()
            while len(done) < devices:
                m = recv_until(lambda m: m["type"] in (P.TOKENS, P.ERROR), "waiting for the engines to start")
                if m["type"] == P.ERROR:
                    raise RuntimeError(f"warm-up on device {(m.get('id') or 1) - 1} failed: "
                                       f"{m.get('code')}: {m.get('message')}")
                done.update(it["id"] for it in m["items"] if it["finished"])
            # With several TP levels the other levels' processes start beside
            # the TP1 ones; a plan into one still starting would be refused.
            while True:
                conn.send({"type": P.STATS})
                m = recv_until(lambda m: m["type"] == P.STATS, "waiting for every TP level's process to start")
                starting = [p["tp_group"] for p in m.get("processes", []) if p["state"] != "ready"]
                if not starting:
                    break
                if stop.wait(0.5):
                    raise KeyboardInterrupt
        finally:
            conn.close()
            ctx.term()

    def exited(self) -> str | None:
        """Why serving cannot go on: the agent exited (None while it runs)."""
        if self.popen.poll() is None:
            return None
        return f"the agent exited with code {self.popen.returncode}"

    def _procs(self) -> list:
        """The agent, its descendants, and anything started with our log dir (executors run
        in their own sessions)."""
        import psutil

        found = {}
        try:
            root = psutil.Process(self.popen.pid)
            found[root.pid] = root
            for c in root.children(recursive=True):
                found[c.pid] = c
        except psutil.NoSuchProcess:
            pass
        marker = str(self.log_dir)
        for p in psutil.process_iter(["cmdline"]):
            try:
                if p.pid != os.getpid() and marker in " ".join(p.info["cmdline"] or []):
                    found[p.pid] = p
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return list(found.values())

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the agent (it stops its processes); then SIGKILL to what is left."""
        import psutil

        procs = self._procs()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("the agent did not stop in %.0fs; killing it", timeout_s)
        # Last resort: the agent's process group, then every process we know of.
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        procs = [p for p in procs + self._procs() if p.is_running()]
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        self.popen.wait(timeout=10)


def _with_machine_profile(settings: GatewaySettings, model: str, cores_per_device: int) -> GatewaySettings:
    """`settings` planning with this machine's cached profile of `model`,
    measured now if there is none: before the agent starts, so that nothing
    else loads the cores, and with the cores the agent gives each device."""
    from tiertp.profiling.machine_profile import machine_profile

    path = machine_profile(model, "cpu", settings.tp_levels, cores_per_device,
                           announce=lambda line: print(f"tiertp serve: {line}", flush=True))
    return dataclasses.replace(settings, profile=str(path), profile_path=str(path))


def run(args: argparse.Namespace) -> int:
    if args.devices < 1:
        raise ServeInputError(f"--devices must be >= 1, got {args.devices}")
    # The planner uses only the TP levels the workers run. Checked here, as
    # the agent would, so a bad level is a one-line error before anything starts.
    try:
        agent_config = AgentConfig(devices=args.devices, tp_levels=tuple(args.tp_levels))
    except ValueError as e:
        raise ServeInputError(str(e)) from None
    settings = gateway_settings(args)

    from tiertp.worker.key_file import load_key_file, write_key_file

    key_file = args.key_file
    if key_file is not None:
        load_key_file(key_file)  # a bad one is an error before anything starts
    if settings.profile == MEASURED:
        from tiertp.engine.isolated import IsolatedRunError

        try:
            settings = _with_machine_profile(settings, args.model, agent_config.resolved_cores_per_device())
        except IsolatedRunError as e:
            print(f"tiertp serve: error: measuring this machine's profile failed ({e}); serve with --profile "
                  "synthetic or a profile file instead", file=sys.stderr, flush=True)
            return 1
    worker_port = args.worker_port or free_port("127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{worker_port}"
    # Private to this user (mode 0700): the logs unless --log-dir, the key unless --key-file.
    tmp = tempfile.TemporaryDirectory(prefix="tiertp-serve-", ignore_cleanup_errors=True)
    log_dir = args.log_dir or Path(tmp.name) / "logs"
    if key_file is None:
        key_file = Path(tmp.name) / "control.key"
        write_key_file(key_file)
    key = load_key_file(key_file)

    with stop_on_signals() as stop:
        agent = None
        try:
            agent = AgentProcess(args.model, args.devices, settings.tp_levels, endpoint, log_dir, key_file, key)
            agent.wait_ready(first_tier(settings.tiers_path), args.devices, args.ready_timeout, stop)
            return serve_gateway("tiertp serve", settings, [(endpoint, args.devices)], key,
                                 f"{args.devices} CPU device(s)", stop, check=agent.exited)
        except KeyboardInterrupt:
            log.info("interrupted: shutting down")
            return 130
        finally:
            if agent is not None:
                agent.stop()
            tmp.cleanup()
            print("tiertp serve: stopped", flush=True)
