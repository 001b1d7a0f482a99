"""A node agent under test: a real `tiertp worker` process and real ZeroMQ
DEALER clients speaking docs/worker-protocol.md, sealed with the agent's key
(shared by the agent tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import zmq

from tiertp.engine.isolated import stop_group
from tiertp.worker.agent_client import AgentClient
from tiertp.worker.key_file import load_key_file, write_key_file

# Long enough for an engine start on a loaded 2-core machine; a guard against
# hangs, not a timing assertion.
RECV_TIMEOUT_S = 240
MAX_TOKENS = 12


def _sampling(max_tokens: int = MAX_TOKENS, **over) -> dict:
    return {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0, "seed": None, "stop_token_ids": [], **over}


def _submit(rid: int, input_ids: list[int], max_tokens: int = MAX_TOKENS, **over) -> dict:
    return {"type": "submit", "id": rid, "tier": "chat", "input_ids": input_ids, "sampling": _sampling(max_tokens),
            "class": "feasible", **over}


class Client:
    """A client holding the agent's key; `recv` fails the test (with the agent's log) instead of hanging."""

    def __init__(self, ctx: zmq.Context, endpoint: str, agent: "AgentProcess"):
        self.conn = AgentClient(ctx, endpoint, agent.key)
        self.agent = agent

    def send(self, msg: dict) -> None:
        self.conn.send(msg)

    def send_payload(self, payload: bytes) -> None:
        """A message's bytes as they are, sealed (malformed ones included)."""
        self.conn.send_payload(payload)

    def recv(self) -> dict:
        if not self.conn.poll(RECV_TIMEOUT_S * 1000):
            pytest.fail(f"no message from the agent in {RECV_TIMEOUT_S} s\n{self.agent.log_tail()}")
        return self.conn.recv()

    def request(self, msg: dict) -> dict:
        self.send(msg)
        return self.recv()

    def barrier(self) -> list[dict]:
        """Everything the agent sent this client before answering a ping."""
        self.send({"type": "ping"})
        seen = []
        while (m := self.recv())["type"] != "pong":
            seen.append(m)
        return seen

    def run_to_end(self, ids: set[int]) -> tuple[dict[int, list[dict]], dict[int, dict]]:
        """Token items per id and each id's terminal message (a finished item or an error)."""
        items: dict[int, list[dict]] = {i: [] for i in ids}
        terminal: dict[int, dict] = {}
        while set(terminal) != ids:
            m = self.recv()
            if m["type"] == "tokens":
                for it in m["items"]:
                    assert it["id"] in ids and it["id"] not in terminal, f"item after the end: {it}"
                    items[it["id"]].append(it)
                    if it["finished"]:
                        terminal[it["id"]] = {"type": "tokens", **it}
            elif m["type"] == "error" and m["id"] in ids:
                assert m["id"] not in terminal, f"second terminal message: {m}"
                terminal[m["id"]] = m
            else:
                pytest.fail(f"unexpected message {m}")
        # Nothing more may come for these ids.
        late = [m for m in self.barrier() if m.get("id") in ids or any(
            it["id"] in ids for it in m.get("items", []))]
        assert not late, late
        return items, terminal


class AgentProcess:
    """`tiertp worker` in its own session; `extra` are more `tiertp worker` options;
    `bind`: its endpoint (default: an ipc socket in `tmp`); `key_file`: its
    control-plane key (default: a new one in `tmp`), also in `key`."""

    def __init__(self, tmp: Path, model: str, devices: int = 1, extra: tuple[str, ...] = (), bind: str | None = None,
                 key_file: Path | None = None, verbose: bool = False):
        self.endpoint = bind or f"ipc://{tmp}/agent.sock"
        self.log_path = tmp / "agent.log"
        if key_file is None:
            key_file = tmp / "control.key"
            write_key_file(key_file)
        self.key_file, self.key = key_file, load_key_file(key_file)
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tiertp.cli", *(["-v"] if verbose else []), "worker", "--bind", self.endpoint,
                 "--model", model, "--devices", str(devices), "--log-dir", str(tmp / "logs"),
                 "--key-file", str(key_file), *extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.log_dir = tmp / "logs"

    def executors(self) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.popen.pid).children()
                if "tiertp.worker.executor" in " ".join(p.cmdline())]

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace")[-3000:]
        for f in sorted(self.log_dir.glob("*.log")):
            text += f"\n--- {f.name} ---\n" + f.read_text(errors="replace")[-2000:]
        return text




def stop_agent(proc: AgentProcess) -> None:
    """SIGTERM, then kill whatever is left of the agent and its executors (their own sessions)."""
    stop_group(proc.popen)  # whatever is left in its group is killed
    for p in list(psutil.process_iter(["cmdline"])):  # executors live in their own sessions
        if str(proc.log_dir) in " ".join(p.info["cmdline"] or []):
            p.kill()


@pytest.fixture
def client(agent):
    """A protocol client of the module's `agent` fixture (a test module
    defines `agent` and imports this fixture)."""
    ctx = zmq.Context()
    c = Client(ctx, agent.endpoint, agent)
    yield c
    c.conn.close()
    ctx.term()
