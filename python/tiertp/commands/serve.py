"""`tiertp serve`: the node agent and the OpenAI-compatible gateway on this machine.

Starts `tiertp worker` (one SGLang execution process per logical device, on
CPU) as a subprocess, waits until it answers a ping and every device has
served a one-token warm-up request, then runs the gateway (Rust, in this
process) pointed at it. Prints the URL and the API keys of each tier, serves
until SIGINT (Ctrl-C) or SIGTERM, then stops the gateway, the agent and every
execution process. With no options it serves SmolLM2-135M with the embedded
tiers on http://127.0.0.1:8000.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

from tiertp.engine.models import EMBEDDED_MODELS

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_TIERS = Path(__file__).resolve().parent.parent / "defaults" / "tiers.toml"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI API: gateway + node agent on this machine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"embedded model ({', '.join(EMBEDDED_MODELS)}) or an HF model directory "
                        f"(default {DEFAULT_MODEL})")
    p.add_argument("--devices", type=int, default=1, help="logical devices (one execution process each; default 1)")
    p.add_argument("--tiers", type=Path, default=None,
                   help="tier TOML (names, SLOs, weights, api_keys; default: the embedded tiers)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0: a free one; default 8000)")
    p.add_argument("--worker-port", type=int, default=0,
                   help="loopback TCP port of the agent's ZeroMQ socket (0: a free one)")
    p.add_argument("--ready-timeout", type=float, default=600.0,
                   help="seconds to wait for the agent and its engines (default 600)")
    p.add_argument("--log-dir", type=Path, default=None, help="execution process logs (default: a temp dir)")
    p.set_defaults(func=run)


def _free_port(host: str) -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _check_port(host: str, port: int) -> None:
    from tiertp.cli import UserError

    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: must be in 0..65535")
    if port == 0:
        return
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


class _Stop:
    """Set by SIGINT/SIGTERM; the main thread waits on it."""

    def __init__(self):
        self.event = threading.Event()
        self.signum: int | None = None
        self._old = {}

    def install(self) -> None:
        for s in _STOP_SIGNALS:
            self._old[s] = signal.signal(s, self._handler)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handler(self, signum, _frame) -> None:
        self.signum = signum
        self.event.set()


class Agent:
    """The `tiertp worker` subprocess (own session) and its execution processes."""

    def __init__(self, model: str, devices: int, endpoint: str, log_dir: Path):
        self.endpoint = endpoint
        self.log_dir = log_dir
        cmd = [sys.executable, "-m", "tiertp.cli", "worker", "--bind", endpoint, "--model", model,
               "--devices", str(devices), "--log-dir", str(log_dir)]
        log.info("starting the agent: %s", " ".join(cmd))
        self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, tier: str, devices: int, timeout_s: float, stop: _Stop) -> None:
        """Ping until pong, then one warm-up request per device; RuntimeError if
        the agent dies, a device fails to serve, or the time runs out."""
        import zmq

        from tiertp.worker import protocol as P

        deadline = time.monotonic() + timeout_s
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        try:
            def recv_until(pred, what: str) -> dict:
                while True:
                    if stop.event.is_set():
                        raise KeyboardInterrupt
                    if self.popen.poll() is not None:
                        raise RuntimeError(f"the agent exited with code {self.popen.returncode} while {what}")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError(f"timed out after {timeout_s:.0f}s {what} (--ready-timeout)")
                    if sock.poll(int(min(left, 0.5) * 1000)):
                        msg = P.decode(sock.recv())
                        if pred(msg):
                            return msg
                    elif what.startswith("waiting for the agent"):
                        sock.send(P.encode({"type": P.PING}))

            sock.send(P.encode({"type": P.PING}))
            recv_until(lambda m: m["type"] == P.PONG, "waiting for the agent to answer a ping")
            log.info("agent is up; warming up %d device(s) (engine start may take a minute)", devices)
            for d in range(devices):
                sock.send(P.encode({"type": P.SUBMIT, "id": d + 1, "tier": tier, "input_ids": [1, 2, 3],
                                    "sampling": {"max_tokens": 1, "temperature": 0.0, "top_p": 1.0,
                                                 "seed": None, "stop_token_ids": []},
                                    "class": "best_effort", "group": [d, 1]}))
            done: set[int] = set()
            while len(done) < devices:
                m = recv_until(lambda m: m["type"] in (P.TOKENS, P.ERROR), "waiting for the engines to start")
                if m["type"] == P.ERROR:
                    raise RuntimeError(f"warm-up on device {(m.get('id') or 1) - 1} failed: "
                                       f"{m.get('code')}: {m.get('message')}")
                done.update(it["id"] for it in m["items"] if it["finished"])
        finally:
            sock.close(0)
            ctx.term()

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


def run(args: argparse.Namespace) -> int:
    from tiertp import _scheduler
    from tiertp.cli import UserError
    from tiertp.engine.models import model_name, resolve_model

    if args.devices < 1:
        raise UserError(f"--devices must be >= 1, got {args.devices}")
    tiers_path = args.tiers or DEFAULT_TIERS
    if not Path(tiers_path).is_file():
        raise UserError(f"--tiers {tiers_path}: no such file")
    _scheduler.TierSet.load(str(tiers_path))  # TierConfigError (a ValueError) names the problem
    _check_port(args.host, args.port)
    model_dir = resolve_model(args.model)  # ModelError lists the embedded models
    name = model_name(args.model)

    worker_port = args.worker_port or _free_port("127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{worker_port}"
    tmp = None
    log_dir = args.log_dir
    if log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tiertp-serve-", ignore_cleanup_errors=True)
        log_dir = Path(tmp.name) / "logs"

    stop = _Stop()
    stop.install()
    agent = None
    gateway = None
    try:
        agent = Agent(args.model, args.devices, endpoint, log_dir)
        agent.wait_ready(_first_tier(tiers_path), args.devices, args.ready_timeout, stop)
        try:
            gateway = _scheduler.GatewayServer(str(tiers_path), name, str(model_dir), [(endpoint, args.devices)],
                                               host=args.host, port=args.port)
        except OSError as e:
            raise UserError(str(e)) from None
        url = f"http://{gateway.address}/v1"
        print(f"tiertp serve: model {name!r} on {args.devices} CPU device(s)", flush=True)
        print(f"tiertp serve: OpenAI API at {url}", flush=True)
        for tier, keys in _tier_keys(tiers_path):
            print(f"tiertp serve:   tier {tier}: api key(s) {', '.join(keys) or '(none)'}", flush=True)
        print("tiertp serve: press Ctrl-C to stop", flush=True)
        while not stop.event.wait(0.5):
            if agent.popen.poll() is not None:
                log.error("the agent exited with code %s; stopping", agent.popen.returncode)
                return 1
        log.info("signal %s: shutting down", signal.Signals(stop.signum).name)
        return 0
    except KeyboardInterrupt:
        log.info("interrupted: shutting down")
        return 130
    finally:
        # Further signals must not interrupt the cleanup.
        for s in _STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        try:
            if gateway is not None:
                gateway.shutdown(5.0)
        except BaseException as e:  # noqa: BLE001 - the agent must still be stopped
            log.error("gateway shutdown failed: %s", e)
        finally:
            if agent is not None:
                agent.stop()
            if tmp is not None:
                tmp.cleanup()
            stop.restore()
        print("tiertp serve: stopped", flush=True)


def _tier_keys(path: Path) -> list[tuple[str, list[str]]]:
    import tomllib

    data = tomllib.loads(Path(path).read_text())
    return [(t.get("name", "?"), list(t.get("api_keys", []))) for t in data.get("tier", [])]


def _first_tier(path: Path) -> str:
    return _tier_keys(path)[0][0]
