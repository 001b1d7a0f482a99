"""Several nodes on this machine: `tiertp gateway` over two agents, each a
"node" of one device behind its own TCP port (`tiertp worker --bind
tcp://0.0.0.0:PORT`). The gateway starts while the second node's agent is
not up yet; it joins the plan once it is. Under streamed load (the official openai client) one
agent's process group is killed (SIGKILL): every request completes or fails
with an error naming the lost worker, none hangs, and the plan re-forms
without that node. Restarted on the same port, the agent rejoins the plan
and serves requests again (shown by then killing the other agent: only the
restarted one is left to serve).

One tier with loose SLOs: the CPU engine is far slower than the profile the
planner assumes, and shedding is not what this test is about.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

import httpx
import openai
import pytest
from agent_harness import AgentProcess, stop_agent
from test_serve_openai import MODEL, Serve

from tiertp.worker.key_file import write_key_file
from tiertp.worker.stats_query import StatsUnanswered, ask_stats
from tiertp.ports import free_port
from tier_files import tier_text

pytestmark = pytest.mark.slow

TIERS = tier_text("serve-multinode")
KEY = "sk-chat"
CLIENTS = 4
MAX_TOKENS = 16
# Guards against hangs, not timing assertions: an engine start on a loaded
# 2-core machine, one request.
START_S = 180
REQUEST_S = 60
# Plan changes follow a lost connection at once; a window is 0.25 s.
PLAN_S = 30




class Node:
    """One node: an agent on its own port, restartable on that port, holding the cluster's key."""

    def __init__(self, tmp, name: str, key_file):
        self.tmp = tmp
        self.key_file = key_file
        self.name = name
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.starts = 0
        self.agent: AgentProcess | None = None

    def start(self) -> None:
        self.starts += 1
        run_dir = self.tmp / f"{self.name}-{self.starts}"
        run_dir.mkdir()
        self.agent = AgentProcess(run_dir, MODEL, devices=1, bind=f"tcp://0.0.0.0:{self.port}", key_file=self.key_file)

    def crash(self) -> None:
        """SIGKILL to the agent's process group: no goodbye to the gateway."""
        os.killpg(self.agent.popen.pid, signal.SIGKILL)
        self.agent.popen.wait(timeout=30)

    def running(self) -> int:
        """Requests running on the agent's device (0 if it does not answer)."""
        try:
            return sum(d["running"] for d in ask_stats(self.endpoint, self.agent.key, timeout_s=2.0)["devices"])
        except StatsUnanswered:
            return 0


@dataclass
class Outcome:
    status: str  # "completed" or "failed"
    detail: str  # the finish reason, or the error's message
    ended: float  # time.monotonic()


class Load:
    """CLIENTS threads, each streaming chat requests back to back until stopped."""

    def __init__(self, url: str):
        self.url = url
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def _client(self, i: int) -> None:
        c = openai.OpenAI(base_url=self.url, api_key=KEY, max_retries=0, timeout=REQUEST_S)
        while not self.stop.is_set():
            self.outcomes.append(stream_one(c, f"client {i} says hello"))

    def finish(self) -> list[Outcome]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=REQUEST_S + 10)
        hung = [t.name for t in self.threads if t.is_alive()]
        assert not hung, f"requests never ended: {hung}"
        return self.outcomes


def stream_one(c: openai.OpenAI, prompt: str) -> Outcome:
    try:
        stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=MAX_TOKENS, temperature=0, stream=True)
        finish = None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return Outcome("completed" if finish else "failed", finish or "the stream ended without a finish",
                       time.monotonic())
    except openai.APIError as e:
        return Outcome("failed", e.message, time.monotonic())


def plan(url: str) -> dict:
    return httpx.get(f"{url}/plan", timeout=30).json()


def wait_plan(url: str, what: str, ok, timeout_s: float) -> dict:
    """The gateway's plan once `ok(plan)` holds; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        p = plan(url)
        if ok(p):
            return p
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {p}"
        time.sleep(0.25)


def serving_only(node: int):
    """A check: the plan's groups all on `node`'s GPU (global GPU = node
    here, one device each), the other node out, every connected agent runs it."""
    def ok(p: dict) -> bool:
        other = 1 - node
        return (p["gpus_down"] == [other] and not p["workers"][other]["connected"]
                and {g["first_gpu"] for g in p["groups"]} == {node}
                and p["workers"][node]["applied_plan_id"] == p["plan_id"])
    return ok


def serving_both(p: dict) -> bool:
    return (p["gpus_down"] == [] and {g["first_gpu"] for g in p["groups"]} == {0, 1}
            and all(w["connected"] and w["applied_plan_id"] == p["plan_id"] for w in p["workers"]))


@pytest.fixture
def cluster(tmp_path):
    """Two nodes and `tiertp gateway` over both, with only the first node's
    agent started (the gateway starts once it is ready)."""
    key_file = tmp_path / "control.key"
    write_key_file(key_file)
    nodes = [Node(tmp_path, "node-a", key_file), Node(tmp_path, "node-b", key_file)]
    nodes[0].start()
    tiers = tmp_path / "tiers.toml"
    tiers.write_text(TIERS)
    workers = [a for n in nodes for a in ("--worker", f"{n.endpoint}=1")]
    gateway = Serve(tmp_path, ("--tiers", str(tiers), "--window", "0.25", "--key-file", str(key_file), *workers),
                    command=("gateway",))
    try:
        gateway.url = gateway.wait_url()
        yield gateway, nodes
        gateway.stop_cleanly()
    finally:
        gateway.kill_everything()
        for n in nodes:
            if n.agent is not None:
                stop_agent(n.agent)


def test_a_node_late_or_lost_under_load_is_out_of_the_plan_until_it_joins(cluster):
    gateway, (a, b) = cluster
    url = gateway.url
    # Node B's agent was not up at start: out of the plan until it is.
    p = plan(url)
    assert p["gpus_down"] == [1] and not p["workers"][1]["connected"], p
    b.start()
    wait_plan(url, "node B joining the plan", serving_both, START_S)

    # Load on both nodes; node B dies while it runs requests.
    load = Load(url)
    deadline = time.monotonic() + START_S
    while b.running() == 0:
        assert time.monotonic() < deadline, "no request ever ran on node B"
        time.sleep(0.05)
    b.crash()
    killed = time.monotonic()
    wait_plan(url, "a plan without node B", serving_only(0), PLAN_S)
    # Requests keep being served meanwhile (by node A), then the load stops.
    while not any(o.status == "completed" and o.ended > killed + 0.5 for o in list(load.outcomes)):
        assert time.monotonic() < killed + PLAN_S + REQUEST_S, "no request completed after node B died"
        time.sleep(0.1)
    outcomes = load.finish()

    # Every request completed or failed naming its lost worker; those that
    # ran on node B failed (tokens already streamed) or were re-dispatched.
    completed = [o for o in outcomes if o.status == "completed"]
    failed = [o for o in outcomes if o.status == "failed"]
    assert all(o.detail in ("length", "stop") for o in completed), completed
    unexplained = [o.detail for o in failed if "the worker serving the request is gone" not in o.detail]
    assert not unexplained, unexplained
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    redispatched = next(int(float(line.split()[-1])) for line in metrics.splitlines()
                        if line.startswith("tiertp_redispatches_total "))
    assert failed or redispatched, "the kill hit no request"
    print(f"{len(outcomes)} requests: {len(completed)} completed, {len(failed)} failed naming the lost worker, "
          f"{redispatched} re-dispatched")

    # Node B comes back on the same port: it rejoins the plan.
    b.start()
    wait_plan(url, "node B back in the plan", serving_both, START_S)
    # Node A dies: now only node B can serve, and it does.
    a.crash()
    wait_plan(url, "a plan without node A", serving_only(1), PLAN_S)
    c = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=REQUEST_S)
    for i in range(2):
        o = stream_one(c, f"after the rejoin {i}")
        assert (o.status, o.detail) in (("completed", "length"), ("completed", "stop")), o
