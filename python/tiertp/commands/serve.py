"""`tiertp serve`: the node agent and the OpenAI-compatible gateway on this machine.

Starts `tiertp worker` (one SGLang execution process per logical device, on
CPU) as a subprocess, waits until it answers a ping and every device has
served a one-token warm-up request, then runs the gateway (Rust, in this
process) pointed at it: tiers and their API keys and limits from the tier
file, the control loop planning over the workers' devices with the profile
(--profile) at the TP levels the workers run (--tp-levels: with more than
one, every window's plan may merge or split devices' TP groups, and the
agent switches its warm processes in milliseconds). Prints the URL, each tier's API
key and how to call it (curl, openai SDK), serves until SIGINT (Ctrl-C) or
SIGTERM, then stops the gateway, the agent and every execution process. With
no options it serves SmolLM2-135M with the embedded tiers on
http://127.0.0.1:8000.
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

from tiertp._scheduler import DEFAULT_GATEWAY_HOST, DEFAULT_GATEWAY_PORT, SAMPLING_DEFAULTS
from tiertp.commands.worker import parse_tp_levels
from tiertp.defaults import DEFAULT_TIERS
from tiertp.engine.models import EMBEDDED_MODELS
from tiertp.profile_source import SYNTHETIC
from tiertp.worker.config import AgentConfig, check_model_fits_tp_levels

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ServeInputError(ValueError):
    """Bad input to serve, printed by the CLI as one line (exit code 2). A
    ValueError rather than tiertp.cli.UserError: under `python -m tiertp.cli`
    the CLI module runs as __main__ and catches its own copy of UserError,
    not the one imported here; both copies of the CLI catch ValueError."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI API: gateway + node agent on this machine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"embedded model ({', '.join(EMBEDDED_MODELS)}) or an HF model directory "
                        f"(default {DEFAULT_MODEL})")
    p.add_argument("--devices", type=int, default=1, help="logical devices (one execution process each; default 1)")
    p.add_argument("--tp-levels", type=parse_tp_levels, default=AgentConfig().tp_levels,
                   help="candidate TP levels, e.g. 1,2 (powers of two, at most --devices, that split the "
                        "model's heads): the agent keeps a warm process per aligned group at each level and "
                        "the planner may switch between them every window (default: 1, no switching)")
    p.add_argument("--tiers", type=Path, default=None,
                   help="tier TOML (names, SLOs, weights, api_keys, max_concurrent_requests, "
                        "max_requests_per_minute; default: the embedded tiers)")
    p.add_argument("--profile", default=SYNTHETIC,
                   help=f"TP performance profile JSON the planner uses (e.g. written by `tiertp profile`), "
                        f"or '{SYNTHETIC}' for the analytic model (default: {SYNTHETIC})")
    p.add_argument("--window", type=float, default=None, metavar="S",
                   help="control window in seconds, 0.25-5: the planner runs and worker health is polled this "
                        "often (default: the gateway's)")
    p.add_argument("--sampling-defaults", choices=SAMPLING_DEFAULTS, default="model",
                   help="temperature and top_p for requests that omit them: 'model' takes the model's "
                        "generation_config.json (as SGLang and vLLM do; OpenAI's 1.0 where it gives none), "
                        "'openai' always takes OpenAI's API defaults (temperature 1.0, top_p 1.0) "
                        "(default: %(default)s)")
    p.add_argument("--host", default=DEFAULT_GATEWAY_HOST, help="HTTP address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_GATEWAY_PORT, help="HTTP port (0: a free one; default %(default)s)")
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
    if not 0 <= port <= 65535:
        raise ServeInputError(f"--port {port}: must be in 0..65535")
    if port == 0:
        return
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServeInputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


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

    def __init__(self, model: str, devices: int, tp_levels: list[int], endpoint: str, log_dir: Path):
        self.endpoint = endpoint
        self.log_dir = log_dir
        cmd = [sys.executable, "-m", "tiertp.cli", "worker", "--bind", endpoint, "--model", model,
               "--devices", str(devices), "--tp-levels", ",".join(map(str, tp_levels)), "--log-dir", str(log_dir)]
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
            # With several TP levels the other levels' processes start beside
            # the TP1 ones; a plan into one still starting would be refused.
            while True:
                sock.send(P.encode({"type": P.STATS}))
                m = recv_until(lambda m: m["type"] == P.STATS, "waiting for every TP level's process to start")
                starting = [p["tp_group"] for p in m.get("processes", []) if p["state"] != "ready"]
                if not starting:
                    break
                if stop.event.wait(0.5):
                    raise KeyboardInterrupt
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
    from tiertp.engine.models import model_name, resolve_model

    if args.devices < 1:
        raise ServeInputError(f"--devices must be >= 1, got {args.devices}")
    tiers_path = args.tiers or DEFAULT_TIERS
    if not Path(tiers_path).is_file():
        raise ServeInputError(f"--tiers {tiers_path}: no such file")
    _scheduler.TierSet.load(str(tiers_path))  # TierConfigError (a ValueError) names the problem
    # The planner uses only the TP levels the workers run. Checked here, as
    # the agent would, so a bad level is a one-line error before anything starts.
    try:
        AgentConfig(devices=args.devices, tp_levels=tuple(args.tp_levels))
    except ValueError as e:
        raise ServeInputError(str(e)) from None
    tp_levels = sorted(set(args.tp_levels))
    profile_path = _check_profile(args.profile, tp_levels)
    _check_port(args.host, args.port)
    model_dir = resolve_model(args.model)  # ModelError lists the embedded models
    name = model_name(args.model)
    try:
        check_model_fits_tp_levels(args.model, tuple(tp_levels))
    except ValueError as e:
        raise ServeInputError(str(e)) from None

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
        agent = Agent(args.model, args.devices, tp_levels, endpoint, log_dir)
        agent.wait_ready(_first_tier(tiers_path), args.devices, args.ready_timeout, stop)
        try:
            gateway = _scheduler.GatewayServer(str(tiers_path), name, str(model_dir), [(endpoint, args.devices)],
                                               host=args.host, port=args.port, profile_path=profile_path,
                                               tp_levels=tp_levels, window_s=args.window,
                                               sampling_defaults=args.sampling_defaults)
        except OSError as e:
            raise ServeInputError(str(e)) from None
        print(banner(gateway.address, name, args.devices, tp_levels, args.profile, tiers_path), flush=True)
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


def _check_profile(profile: str, tp_levels: list[int]) -> str | None:
    """The profile file for the gateway (None: the synthetic profile), checked
    now so that a bad file is a one-line error before anything starts."""
    from tiertp import _scheduler

    if profile == SYNTHETIC:
        return None
    if not Path(profile).is_file():
        raise ServeInputError(f"--profile {profile}: no such file")
    try:
        loaded = _scheduler.Profile.load(profile)
    except ValueError as e:
        raise ServeInputError(f"--profile {profile}: {e}") from None
    missing = sorted(set(tp_levels) - set(loaded.tp_levels))
    if missing:
        raise ServeInputError(f"--profile {profile}: no table for TP level(s) {missing}; the workers run TP "
                              f"{tp_levels} (the profile has {loaded.tp_levels})")
    return profile


def _tiers(path: Path) -> list[dict]:
    """The tier file's tables (already validated by TierSet.load)."""
    import tomllib

    return tomllib.loads(Path(path).read_text()).get("tier", [])


def _first_tier(path: Path) -> str:
    return _tiers(path)[0]["name"]


def _describe(tier: dict) -> str:
    slo = ("background (no SLO)" if tier.get("background")
           else f"TTFT {tier['ttft_ms']:g} ms, TPOT {tier['tpot_ms']:g} ms")
    limits = [f"{tier['max_concurrent_requests']} concurrent" if "max_concurrent_requests" in tier else "",
              f"{tier['max_requests_per_minute']:g} requests/min" if "max_requests_per_minute" in tier else ""]
    limits = [x for x in limits if x]
    return f"{slo}; limits: {', '.join(limits) or 'none'}"


def banner(address: str, model: str, devices: int, tp_levels: list[int], profile: str, tiers_path: Path) -> str:
    """What serve prints once ready: where it listens, each tier's key, and
    how to call it."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "[::]"):  # listening everywhere: this machine can use loopback
        host = "127.0.0.1"
    base = f"http://{host}:{port}"
    tiers = _tiers(tiers_path)
    lines = [f"tiertp serve: model {model!r} on {devices} CPU device(s), TP {tp_levels}, profile {profile}",
             f"tiertp serve: OpenAI API at {base}/v1"]
    width = max(len(t["name"]) for t in tiers)
    for t in tiers:
        keys = ", ".join(t.get("api_keys", [])) or "(no API key)"
        lines.append(f"tiertp serve:   tier {t['name']:<{width}}  key {keys}  ({_describe(t)})")
    key = next((t["api_keys"][0] for t in tiers if t.get("api_keys")), "KEY")
    body = ('{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}' % model)
    lines += [
        "",
        "Try it (any tier's key; the header x-tiertp-tier may ask for a lower tier):",
        f"  curl {base}/v1/chat/completions \\",
        f"    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\",
        f"    -d '{body}'",
        "",
        "  from openai import OpenAI",
        f"  client = OpenAI(base_url=\"{base}/v1\", api_key=\"{key}\")",
        f"  r = client.chat.completions.create(model=\"{model}\", messages=[{{\"role\": \"user\", "
        f"\"content\": \"Hello!\"}}], max_tokens=32)",
        "  print(r.choices[0].message.content)",
        "",
        f"tiertp serve: plan {base}/v1/plan, metrics {base}/metrics, health {base}/health",
        "tiertp serve: press Ctrl-C to stop",
    ]
    return "\n".join(lines)
