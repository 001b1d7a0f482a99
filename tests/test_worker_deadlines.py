"""Deadline shedding: a submit's `start_within_s` becomes a deadline at its
arrival at the agent; a request that has not started by then is failed with
`slo_unattainable` and never takes a batch slot; one without the field never
expires.

No engines: the execution loop runs in this process over a stand-in runner,
and the agent's messages reach it through the same codec they cross the
process boundary with.
"""

from __future__ import annotations

import math
import time

import pytest

from tiertp.tp_group import TpGroup
from tiertp.worker import instance_ops
from tiertp.worker import protocol as P
from tiertp.worker.agent import Agent
from tiertp.worker.config import AgentConfig
from tiertp.worker.executor import ExecutionLoop
from tiertp.worker.messages import parse_apply_plan, parse_submit
from tiertp.worker.process import READY, STARTING
from tiertp.worker.seal import ControlKey
from tiertp.worker.step_runner import ModelLimits, StepOutput, StepRunner

CLIENT = b"client"
MAX_TOKENS = 3


class _Runner(StepRunner):
    """Every request gets token 5 each step; `batches` records each step's rids."""

    def __init__(self):
        self.batches: list[list[int]] = []

    def start(self):
        raise AssertionError("not started in these tests")

    def step(self, batch):
        self.batches.append([r.rid for r in batch])
        return [StepOutput(r.rid, 5, stopped=False) for r in batch]

    def close(self):
        pass

    def stepped(self) -> set[int]:
        return {rid for batch in self.batches for rid in batch}


class _Socket:
    """The execution process's end of its socket: keeps what it sends, decoded."""

    def __init__(self):
        self.sent: list[dict] = []

    def send(self, frame: bytes) -> None:
        self.sent.append(P.decode(frame))


def _add(loop: ExecutionLoop, rid: int, deadline: float = math.inf) -> None:
    loop._handle({"type": "add", "rid": rid, "input_ids": [1, 2, 3], "max_tokens": MAX_TOKENS, "temperature": 0.0,
                  "top_p": 1.0, "seed": None, "stop_token_ids": [], "cls": "feasible", "deadline": deadline})


def _step(loop: ExecutionLoop, now: float) -> None:
    """One pass of the execution loop at time `now`."""
    loop._schedule(now)
    if loop.requests.running:
        loop._iterate()


def test_a_waiting_request_past_its_deadline_is_shed_and_never_batched():
    sock, runner = _Socket(), _Runner()
    loop = ExecutionLoop(sock, runner, batch_cap=1, token_cap=0, kv_capacity_tokens=1000)
    _add(loop, 1)
    _step(loop, now=10.0)  # 1 takes the only batch slot: the device is busy
    _add(loop, 2, deadline=10.5)
    _add(loop, 3)  # no deadline
    _step(loop, now=10.4)
    assert list(loop.requests.waiting) == [2, 3] and not [m for m in sock.sent if m["type"] == "expired"]
    _step(loop, now=10.5)  # due at its deadline
    expired = [m for m in sock.sent if m["type"] == "expired"]
    assert [(m["rids"], m["waiting"]) for m in expired] == [([2], 1)]
    assert list(loop.requests.waiting) == [3] and loop.requests.queued() == 1
    for _ in range(4 * MAX_TOKENS):  # far in the future: a request without a deadline never expires
        _step(loop, now=1e12)
    assert not loop.requests.running and not loop.requests.waiting
    assert runner.stepped() == {1, 3}
    assert len([m for m in sock.sent if m["type"] == "expired"]) == 1


class _Process:
    """An execution process inside this test: the agent's messages go to a real
    ExecutionLoop through the wire codec, and what it sends goes back to the agent."""

    def __init__(self, agent: Agent, batch_cap: int):
        self.agent, self.group, self.generation, self.state = agent, TpGroup(0, 1), 1, READY
        self.limits = ModelLimits(vocab_size=1000, max_request_tokens=512, kv_capacity_tokens=4096)
        self.sock, self.runner = _Socket(), _Runner()
        self.loop = ExecutionLoop(self.sock, self.runner, batch_cap, 0, self.limits.kv_capacity_tokens)
        self.adds: list[dict] = []

    def send(self, msg: dict) -> None:
        msg = P.decode(P.encode(msg))
        if msg["type"] == "add":
            self.adds.append(msg)
        self.loop._handle(msg)
        self.deliver()

    def check(self) -> str | None:  # alive
        return None

    def step(self) -> None:
        _step(self.loop, time.monotonic())
        self.deliver()

    def deliver(self) -> None:
        sent, self.sock.sent = self.sock.sent, []
        for msg in sent:
            self.agent._on_process(self, msg)


@pytest.fixture
def node(tmp_path):
    """An agent (no processes started) whose one device's process is a `_Process` with one batch slot;
    `sent` collects what the agent sends its client."""
    agent = Agent(AgentConfig(bind=f"ipc://{tmp_path}/agent.sock", log_dir=tmp_path / "logs",
                              key=ControlKey.generate()))
    sent: list[dict] = []
    agent._to_client = lambda _client, msg: sent.append(msg)
    proc = _Process(agent, batch_cap=1)
    agent.procs[proc.group] = proc
    yield agent, proc, sent
    agent.procs.clear()
    agent.shutdown()


def _submit(rid: int, **over) -> dict:
    return {"type": "submit", "id": rid, "tier": "chat", "input_ids": [1, 2, 3], "class": "feasible",
            "sampling": {"max_tokens": MAX_TOKENS}, **over}


def _terminal(sent: list[dict]) -> dict[int, str]:
    """Each request's end: "finished", or its error code."""
    ends = {m["id"]: m["code"] for m in sent if m["type"] == "error"}
    for m in sent:
        if m["type"] == "tokens":
            ends.update({it["id"]: "finished" for it in m["items"] if it["finished"]})
    return ends


def _run_to_end(agent: Agent, proc: _Process) -> None:
    for _ in range(10 * MAX_TOKENS):
        if not len(agent.requests):
            return
        proc.step()
    pytest.fail(f"{len(agent.requests)} request(s) never ended")


def test_the_agent_fails_a_request_its_busy_device_could_not_start_in_time(node):
    agent, proc, sent = node
    agent._on_submit(CLIENT, _submit(1))
    proc.step()  # 1 runs: the device is busy
    agent._on_submit(CLIENT, _submit(2, start_within_s=0.01))
    agent._on_submit(CLIENT, _submit(3))  # no deadline
    shed = agent.requests.lookup(CLIENT, 2).rid
    time.sleep(0.02)
    _run_to_end(agent, proc)
    assert _terminal(sent) == {1: "finished", 2: P.SLO_UNATTAINABLE, 3: "finished"}
    assert shed not in proc.runner.stepped()
    error = next(m for m in sent if m["type"] == "error")
    assert "start_within_s = 0.01 s" in error["message"] and "still queued on device 0" in error["message"], error


def test_a_request_held_while_its_process_starts_is_shed_at_its_deadline(node):
    agent, proc, sent = node
    proc.state = STARTING  # the agent holds what it routes there
    agent._on_submit(CLIENT, _submit(4, start_within_s=0.0))
    agent._on_submit(CLIENT, _submit(5))
    agent._tick()
    assert _terminal(sent) == {4: P.SLO_UNATTAINABLE} and "was not ready" in sent[0]["message"]
    proc.state = READY
    agent._on_ready(proc)  # sends it what it held
    _run_to_end(agent, proc)
    assert _terminal(sent) == {4: P.SLO_UNATTAINABLE, 5: "finished"}


def test_a_waiting_request_moved_by_a_switch_keeps_its_deadline(node):
    agent, proc, sent = node
    agent._on_submit(CLIENT, _submit(1))
    proc.step()
    agent._on_submit(CLIENT, _submit(2, start_within_s=30.0))
    req = agent.requests.lookup(CLIENT, 2)
    deadline = req.deadline
    # What a switch does with a waiting request: its process releases it (it
    # holds no KV, so no instance is involved) and the agent sends it again.
    proc.loop.ops.apply(instance_ops.Release([req.rid]))
    agent._on_dropped([req.rid], proc.group)
    agent._settle({proc.group})
    assert [(a["rid"], a["deadline"]) for a in proc.adds if a["rid"] == req.rid] == [(req.rid, deadline)] * 2
    assert proc.loop.requests.shed_expired(deadline - 1.0) == []
    proc.loop._schedule(deadline)  # still busy at the original deadline: shed
    proc.deliver()
    assert _terminal(sent) == {2: P.SLO_UNATTAINABLE}


def test_a_waiting_request_moved_by_a_switch_goes_where_the_plan_placed_it(node):
    agent, proc, sent = node
    other = _Process(agent, batch_cap=1)
    other.group = TpGroup(1, 1)
    agent.procs[other.group] = other
    stopped = TpGroup(0, 2)
    for rid in (1, 2):
        agent.requests.add(CLIENT, parse_submit(_submit(rid)), stopped).sent = False
    placed = agent._placed(CLIENT, parse_apply_plan({"type": "apply_plan", "plan_id": 2, "devices": [],
                                                     "moves": [{"id": 1, "tp_group": [1, 1]}]}))
    agent._settle({proc.group, other.group}, placed)
    # 1 where the plan put it; 2, which it did not name, on the least-loaded group over its devices.
    assert [r.group for r in (agent.requests.lookup(CLIENT, 1), agent.requests.lookup(CLIENT, 2))] == [other.group,
                                                                                                       proc.group]
    assert [a["rid"] for a in other.adds] == [agent.requests.lookup(CLIENT, 1).rid]
