"""The control plane live: a real `tiertp worker` (tiny-llama, one CPU
device, on a loopback TCP port) and `tiertp gateway` over it, both holding
one key file and logging at debug level.

A peer without the key (plain msgpack, another key, a key holder's frame
replayed on another connection) gets no reply at all, and the agent logs a
refusal naming the peer's address, a bounded number of times however many
frames come; the agent keeps serving the gateway meanwhile. Then, with
requests served (and one with a wrong API key refused), neither the
control-plane key nor any API key appears in any log: the gateway's, the
agent's or its execution process's. The one place a tier's key is printed is
the gateway's banner on stdout, by design.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import zmq
from agent_harness import AgentProcess, stop_agent

from tiertp.worker import protocol as P
from tiertp.worker.agent_client import AgentClient
from tiertp.worker.key_file import write_key_file
from tiertp.worker.seal import TO_AGENT, ControlKey, Session
from tiertp.ports import free_port

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
API_KEY = "sk-tier-secret-7f3a9c"
WRONG_API_KEY = "sk-wrong-guess-51d2e0"
TIERS = f"""
[[tier]]
name = "chat"
ttft_ms = 60000
tpot_ms = 10000
api_keys = ["{API_KEY}"]
"""
START_S = 300
# How long a refused peer waits to be sure nothing comes back.
SILENCE_S = 1.5
FLOOD = 200




class Gateway:
    """`tiertp -v gateway` with stdout (the banner) and stderr (the log) kept apart."""

    def __init__(self, tmp: Path, agent: AgentProcess, tiers: Path):
        self.stdout_path, self.stderr_path = tmp / "gateway.out", tmp / "gateway.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tiertp.cli", "-v", "gateway", "--model", MODEL, "--port", "0",
                 "--ready-timeout", str(START_S), "--key-file", str(agent.key_file), "--tiers", str(tiers),
                 "--window", "0.25", "--worker", f"{agent.endpoint}=1"],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_S
        while not (m := re.search(r"OpenAI API at (http://\S+)", self.stdout_path.read_text())):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the gateway did not come up:\n{self.stderr_path.read_text()[-3000:]}\n"
                            f"{agent.log_tail()}")
            time.sleep(0.5)
        self.url = m.group(1)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("control-plane")
    key_file = tmp / "control.key"
    write_key_file(key_file)
    tiers = tmp / "tiers.toml"
    tiers.write_text(TIERS)
    agent = AgentProcess(tmp, MODEL, bind=f"tcp://127.0.0.1:{free_port()}", key_file=key_file, verbose=True)
    gateway = None
    try:
        gateway = Gateway(tmp, agent, tiers)
        yield agent, gateway
    finally:
        if gateway is not None:
            gateway.stop()
        stop_agent(agent)


def _complete(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      json={"model": MODEL, "prompt": "hello there", "max_tokens": 4, "temperature": 0})


def _silent(sock: zmq.Socket) -> bool:
    return not sock.poll(int(SILENCE_S * 1000))


def _refusals(agent: AgentProcess) -> list[str]:
    return [line for line in agent.log_path.read_text(errors="replace").splitlines()
            if "control plane: refused a frame from 127.0.0.1 (connection " in line]


def test_a_peer_without_the_key_gets_nothing_and_the_agent_logs_it(cluster):
    agent, gateway = cluster
    ctx = zmq.Context()
    plain = ctx.socket(zmq.DEALER)
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(agent.endpoint)
    try:
        # A valid-looking request in the clear, as any client before sealing.
        plain.send(P.encode({"type": P.STATS}))
        plain.send(P.encode({"type": P.SUBMIT, "id": 1, "tier": "chat", "input_ids": [1, 2, 3], "class": "feasible",
                             "sampling": {"max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "seed": None,
                                          "stop_token_ids": []}}))
        assert _silent(plain)
        # Sealed, but under another key.
        with AgentClient(ctx, agent.endpoint, ControlKey.generate()) as stranger:
            stranger.send({"type": P.STATS})
            assert _silent(stranger.sock)
        # A key holder's frame: answered once, then replayed on another connection: nothing.
        holder = ctx.socket(zmq.DEALER)
        holder.setsockopt(zmq.LINGER, 0)
        holder.connect(agent.endpoint)
        frame = Session.start(agent.key).sealer(TO_AGENT).seal(P.encode({"type": P.PING}))
        holder.send(frame)
        assert holder.poll(30_000), "the key holder got no pong"
        plain.send(frame)
        assert _silent(plain)
        holder.close(0)
        # A flood: the log stays bounded (one line per peer address per interval).
        for _ in range(FLOOD):
            plain.send(P.encode({"type": P.PING}))
        assert _silent(plain)
    finally:
        plain.close(0)
        ctx.term()
    lines = _refusals(agent)
    assert 1 <= len(lines) <= 3, lines
    assert "WARNING" in lines[0] and "nothing was answered" in lines[0], lines
    # The agent still serves the gateway (over its sealed session).
    r = _complete(gateway.url, API_KEY)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    plan = httpx.get(f"{gateway.url}/plan", timeout=30).json()
    assert plan["workers"][0]["connected"] and plan["gpus_down"] == [], plan


def test_no_key_appears_in_any_log(cluster):
    """Last in the module: it stops the gateway to read everything it logged."""
    agent, gateway = cluster
    assert _complete(gateway.url, API_KEY).status_code == 200
    assert _complete(gateway.url, WRONG_API_KEY).status_code == 401
    gateway.stop()
    stderr = gateway.stderr_path.read_bytes()
    # Logged at debug level (-v) and about its agent: the check below means something.
    assert agent.endpoint.encode() in stderr, stderr[-2000:]
    logs = {"gateway stderr": stderr, "agent log": agent.log_path.read_bytes()}
    logs |= {f.name: f.read_bytes() for f in sorted(agent.log_dir.glob("*.log"))}
    assert len(logs) >= 3, list(logs)  # the execution process's log too
    control = agent.key.raw
    secrets = {"control-plane key (hex)": control.hex().encode(), "control-plane key (HEX)": control.hex().upper()
               .encode(), "control-plane key (raw)": control, "API key": API_KEY.encode(),
               "wrong API key": WRONG_API_KEY.encode()}
    leaks = [(what, where) for where, text in logs.items() for what, s in secrets.items() if s in text]
    assert not leaks, leaks
    # stdout: the banner shows the tier's key (what a user calls with); the control key never.
    stdout = gateway.stdout_path.read_bytes()
    assert API_KEY.encode() in stdout and control.hex().encode() not in stdout
