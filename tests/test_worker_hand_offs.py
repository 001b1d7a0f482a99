"""Prefill -> decode hand-offs are the client's decisions: the agent moves a
request to the group a `hand_off` names (never one it picks itself),
answers `handed_off`, and answers a move it cannot make with a typed failure
while the request keeps decoding where it is. Without a `hand_off` nothing
moves.

No engines: an agent whose three TP1 groups (device 0 prefill, devices 1 and
2 decode) are stand-in processes, and a stand-in switcher that records the
moves it is asked for.
"""

from __future__ import annotations

import logging

import pytest

from tiertp.tp_group import TpGroup
from tiertp.worker import protocol as P
from tiertp.worker.agent import Agent
from tiertp.worker.config import AgentConfig
from tiertp.worker.process import READY, STARTING
from tiertp.worker.seal import ControlKey
from tiertp.worker.step_runner import ModelLimits
from tiertp.worker.switcher import ChangeFailed

CLIENT = b"gateway"
PREFILL, DECODE_A, DECODE_B = TpGroup(0, 1), TpGroup(1, 1), TpGroup(2, 1)


class _Process:
    """A ready execution process that keeps what the agent sends it."""

    def __init__(self, group: TpGroup):
        self.group, self.generation, self.state = group, 1, READY
        self.limits = ModelLimits(vocab_size=1000, max_request_tokens=512, kv_capacity_tokens=4096)
        self.load = {"running": 0, "waiting": 0, "kv_used_tokens": 0}
        self.sent: list[dict] = []

    def send(self, msg: dict) -> None:
        self.sent.append(msg)

    def check(self) -> str | None:
        return None


class _Switcher:
    """Records each hand-off and moves the requests, as the real one does once their KV moved;
    `fail` makes the next one fail (rolled back: nothing moved)."""

    def __init__(self, agent: Agent):
        self.agent, self.calls, self.fail = agent, [], None

    def hand_off(self, src_group, src, rids, dest_group, dest):
        self.calls.append((src_group, list(rids), dest_group))
        if self.fail:
            raise ChangeFailed(self.fail)
        self.agent._on_moved(list(rids), dest_group)
        return list(rids)

    def close(self) -> None:
        pass


@pytest.fixture
def node(tmp_path):
    """The agent with its plan applied, a stand-in process and instance per group, and `sent`:
    what it sends its client."""
    agent = Agent(AgentConfig(bind=f"ipc://{tmp_path}/agent.sock", devices=3, log_dir=tmp_path / "logs",
                              key=ControlKey.generate()))
    sent: list[dict] = []
    agent._to_client = lambda _client, msg: sent.append(msg)
    for g in (PREFILL, DECODE_A, DECODE_B):
        agent.procs[g] = _Process(g)
        agent.instances[g] = object()  # every group takes part in KV moves
    agent.switcher = _Switcher(agent)
    _client(agent, {"type": "apply_plan", "plan_id": 1, "devices": [
        {"device": g.first, "role": role, "tier": "chat", "tp_group": g.as_list(), "batch_cap": 8, "token_cap": 0}
        for g, role in ((PREFILL, "prefill"), (DECODE_A, "decode"), (DECODE_B, "decode"))]})
    assert sent.pop()["ok"] is True
    yield agent, sent
    agent.procs.clear()
    agent.instances.clear()
    agent.shutdown()


def _client(agent: Agent, msg: dict) -> None:
    agent._on_client([CLIENT, P.encode(msg)])


def _submit(agent: Agent, rid: int, group: TpGroup | None = None) -> int:
    """Submit request `rid` (to `group`, else where the agent routes it) and give it its first
    token; the agent's id of it."""
    msg = {"type": "submit", "id": rid, "tier": "chat", "input_ids": [1, 2, 3], "class": "feasible",
           "sampling": {"max_tokens": 8}}
    if group is not None:
        msg["group"] = group.as_list()
    _client(agent, msg)
    req = agent.requests.lookup(CLIENT, rid)
    agent._on_process(agent.procs[req.group], {"type": "tokens", "items": [
        {"rid": req.rid, "token": 5, "finished": False, "finish_reason": None}]})
    return req.rid


def _handed_off(sent: list[dict]) -> list[dict]:
    return [m for m in sent if m["type"] == P.HANDED_OFF]


def _no_terminal(sent: list[dict], rid: int) -> None:
    """Nothing ended request `rid` (an error naming it, or a finished item)."""
    assert not [m for m in sent if m["type"] == P.ERROR and m["id"] == rid]
    assert not [it for m in sent if m["type"] == P.TOKENS for it in m["items"] if it["finished"]]


def test_without_a_hand_off_a_prefilled_request_decodes_where_it_is(node):
    agent, sent = node
    rid = _submit(agent, 1)
    assert agent.requests.get(rid).group == PREFILL
    agent._run_hand_offs()
    agent._tick()
    assert agent.switcher.calls == [] and agent.requests.get(rid).group == PREFILL
    assert agent.moves["hand_offs"] == 0


def test_the_agent_hands_off_to_the_group_named_not_the_least_loaded(node):
    agent, sent = node
    _submit(agent, 9, DECODE_B)  # DECODE_B is busier than DECODE_A
    rids = [_submit(agent, 1), _submit(agent, 2)]
    for i in (1, 2):
        _client(agent, {"type": "hand_off", "id": i, "group": DECODE_B.as_list()})
    assert agent.switcher.calls == []  # made at the end of the loop pass, together
    agent._run_hand_offs()
    assert agent.switcher.calls == [(PREFILL, rids, DECODE_B)]
    assert [agent.requests.get(r).group for r in rids] == [DECODE_B, DECODE_B]
    assert [(m["id"], m["group"], m["ok"], m["code"]) for m in _handed_off(sent)] == [
        (1, [2, 1], True, None), (2, [2, 1], True, None)]
    assert (agent.moves["hand_offs"], agent.moves["handed_off_requests"]) == (1, 2)


def test_a_group_not_active_here_is_a_typed_failure_and_the_request_stays(node, caplog):
    agent, sent = node
    rid = _submit(agent, 1)
    with caplog.at_level(logging.WARNING, logger="tiertp.worker.agent"):
        _client(agent, {"type": "hand_off", "id": 1, "group": [0, 2]})  # e.g. from a plan rejected here
        agent._run_hand_offs()
    [m] = _handed_off(sent)
    assert (m["id"], m["group"], m["ok"], m["code"]) == (1, [0, 2], False, P.UNKNOWN_GROUP), m
    assert "not active here" in m["message"] and "[1, 1]" in m["message"], m
    assert "decodes where it is" in caplog.text
    assert agent.switcher.calls == [] and agent.requests.get(rid).group == PREFILL
    _no_terminal(sent, 1)


def test_a_destination_not_ready_or_an_unknown_request_is_a_typed_failure(node):
    agent, sent = node
    _submit(agent, 1)
    agent.procs[DECODE_A].state = STARTING  # restarting: its instance is gone until it is ready
    del agent.instances[DECODE_A]
    _client(agent, {"type": "hand_off", "id": 1, "group": DECODE_A.as_list()})
    _client(agent, {"type": "hand_off", "id": 77, "group": DECODE_B.as_list()})
    agent._run_hand_offs()
    assert [(m["id"], m["ok"], m["code"]) for m in _handed_off(sent)] == [
        (1, False, P.GROUP_NOT_READY), (77, False, P.NOT_RUNNING)]
    assert agent.switcher.calls == [] and agent.requests.lookup(CLIENT, 1).group == PREFILL
    _no_terminal(sent, 1)


def test_a_failed_move_is_a_typed_failure_and_the_request_decodes_on(node):
    agent, sent = node
    rid = _submit(agent, 1)
    agent.switcher.fail = "no KV room on the destination"
    _client(agent, {"type": "hand_off", "id": 1, "group": DECODE_A.as_list()})
    agent._run_hand_offs()
    [m] = _handed_off(sent)
    assert (m["ok"], m["code"]) == (False, P.MOVE_FAILED) and "no KV room" in m["message"], m
    assert agent.requests.get(rid).group == PREFILL and agent.moves["hand_offs"] == 0
    _no_terminal(sent, 1)


def test_a_request_that_ends_before_its_move_is_answered_not_running(node):
    agent, sent = node
    rid = _submit(agent, 1)
    _client(agent, {"type": "hand_off", "id": 1, "group": DECODE_A.as_list()})
    agent._on_process(agent.procs[PREFILL], {"type": "tokens", "items": [
        {"rid": rid, "token": 6, "finished": True, "finish_reason": "length"}]})
    agent._run_hand_offs()
    assert [(m["id"], m["code"]) for m in _handed_off(sent)] == [(1, P.NOT_RUNNING)]
    assert agent.switcher.calls == []


def test_a_malformed_hand_off_is_an_error_that_ends_no_request(node):
    agent, sent = node
    _submit(agent, 1)
    _client(agent, {"type": "hand_off", "id": 1, "group": [1]})
    [m] = [m for m in sent if m["type"] == P.ERROR]
    assert (m["id"], m["code"]) == (None, P.BAD_REQUEST) and "group must be [first_gpu, tp]" in m["message"], m
    assert agent.requests.lookup(CLIENT, 1) is not None
