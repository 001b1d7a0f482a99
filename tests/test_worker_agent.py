"""The node agent end to end: a real `tiertp worker` process (one CPU device,
tiny-llama on SGLang) and real ZeroMQ DEALER clients speaking
docs/worker-protocol.md.

One agent serves the whole module (each engine start is 15-25 s). Tests run
in file order; the last one shuts the agent down and checks that nothing it
started is left. The fixture's finalizer kills the agent's process group
whatever happens, so no engine outlives the module.
"""

from __future__ import annotations

import concurrent.futures
import signal

import msgspec
import psutil
import pytest
from agent_harness import MAX_TOKENS, AgentProcess, _submit, client, stop_agent
from sglang_generate import ISOLATED_ENV, generate_ids

from tiertp.engine.isolated import run_isolated

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
PROMPTS = [[1, 2, 3, 4, 5], [100, 200, 300], [42] * 20]


@pytest.fixture(scope="module")
def reference():
    """SGLang run directly on the same prompts, started alongside the agent."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(run_isolated, generate_ids,
                         {"model": MODEL, "input_ids": PROMPTS, "max_tokens": MAX_TOKENS}, timeout_s=300,
                         env=ISOLATED_ENV)
    yield future
    pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def agent(tmp_path_factory, reference):
    proc = AgentProcess(tmp_path_factory.mktemp("agent"), MODEL, devices=1)
    yield proc
    stop_agent(proc)


def test_malformed_messages_are_answered_with_errors(client):
    """From a client holding the key; anyone else gets no answer at all (tests/test_control_plane.py)."""
    for frame, problem in [(b"\xc1", "not valid msgpack"), (msgspec.msgpack.encode([1, 2]), "msgpack map"),
                           (msgspec.msgpack.encode({"id": 3}), '"type"')]:
        client.send_payload(frame)
        m = client.recv()
        assert (m["type"], m["id"], m["code"]) == ("error", None, "bad_request") and problem in m["message"], m
    m = client.request({"type": "launch"})
    assert m["code"] == "bad_request" and "unknown message type 'launch'" in m["message"] and "submit" in m["message"]
    m = client.request(_submit(9, [1, 2], **{"class": "urgent"}))
    assert (m["type"], m["id"], m["code"]) == ("error", 9, "bad_request") and "unknown class 'urgent'" in m["message"]
    assert client.request({"type": "ping"}) == {"type": "pong"}


def test_submit_streams_greedy_tokens_equal_to_sglang_direct(client, reference):
    for i, prompt in enumerate(PROMPTS):
        client.send(_submit(i, prompt))
    items, terminal = client.run_to_end(set(range(len(PROMPTS))))
    expected = reference.result()
    for i, prompt in enumerate(PROMPTS):
        tokens = [t for it in items[i] for t in it["tokens"]]
        assert tokens == expected[i], f"prompt {i}"
        assert terminal[i]["type"] == "tokens" and terminal[i]["finish_reason"] == "length"
        assert items[i][0]["prompt_tokens"] == len(prompt)
        assert all("prompt_tokens" not in it for it in items[i][1:])


def test_token_outside_vocabulary_is_a_bad_request(client):
    m = client.request(_submit(20, [1, 10**9]))
    assert (m["id"], m["code"]) == (20, "bad_request") and "vocabulary" in m["message"], m


def test_cancel_ends_a_running_request_with_cancelled(client):
    client.send(_submit(30, PROMPTS[0], max_tokens=3000))
    first = client.recv()
    assert first["type"] == "tokens" and first["items"][0]["id"] == 30, first
    client.send({"type": "cancel", "id": 30})
    while (m := client.recv())["type"] == "tokens":
        assert not any(it["finished"] for it in m["items"]), m
    assert (m["type"], m["id"], m["code"]) == ("error", 30, "cancelled"), m
    assert not [x for x in client.barrier() if x.get("id") == 30 or x.get("items")]
    m = client.request({"type": "cancel", "id": 30})
    assert (m["type"], m["id"], m["code"]) == ("error", None, "bad_request") and "not in flight" in m["message"]


def _stats(client) -> dict:
    m = client.request({"type": "stats"})
    assert m["type"] == "stats", m
    return m


@pytest.mark.parametrize("device, problem", [
    ({"device": 0, "tp_group": [1, 2]}, "misaligned"),
    ({"device": 3, "tp_group": [3, 1]}, "unknown device 3"),
    ({"device": 0, "tp_group": [0, 2]}, "unknown device"),
    ({"device": 0, "role": "leader"}, "unknown role 'leader'"),
])
def test_bad_plan_is_rejected_and_changes_nothing(client, device, problem):
    before = _stats(client)
    d = {"device": 0, "role": "decode", "tier": "chat", "tp_group": [0, 1], "batch_cap": 2, "token_cap": 0, **device}
    m = client.request({"type": "apply_plan", "plan_id": 77, "devices": [d]})
    assert (m["type"], m["plan_id"], m["ok"]) == ("plan_applied", 77, False) and problem in m["reason"], m
    after = _stats(client)
    assert after["plan_id"] == before["plan_id"]
    assert [_assignment(d) for d in after["devices"]] == [_assignment(d) for d in before["devices"]]


def _assignment(device: dict) -> dict:
    """What a plan sets (load figures move on their own)."""
    return {k: device[k] for k in ("device", "role", "tier", "tp_group")}


def test_plan_without_tp_change_is_applied(client):
    d = {"device": 0, "role": "decode", "tier": "chat", "tp_group": [0, 1], "batch_cap": 2, "token_cap": 0}
    m = client.request({"type": "apply_plan", "plan_id": 5, "devices": [d]})
    assert (m["ok"], m["reason"]) == (True, None), m
    s = _stats(client)
    assert s["plan_id"] == 5
    assert _assignment(s["devices"][0]) == {
        "device": 0, "role": "decode", "tier": "chat", "tp_group": [0, 1]}
    # Three requests with a batch cap of 2 still all finish.
    for i in range(3):
        client.send(_submit(40 + i, PROMPTS[i], max_tokens=4))
    _, terminal = client.run_to_end({40, 41, 42})
    assert all(t["type"] == "tokens" for t in terminal.values()), terminal


def _victim(executor: psutil.Process, which: str) -> psutil.Process:
    if which == "executor":
        return executor
    # The process holding the model: SGLang's scheduler (engine runner) or rank 0 (TP instance runner);
    # CPU ranks are forked by a forkserver, so they are the executor's grandchildren.
    [scheduler] = [c for c in executor.children(recursive=True)
                   if any(tag in " ".join(c.cmdline()) for tag in ("sglang::scheduler", "tiertp::tp"))]
    return scheduler


@pytest.mark.parametrize("which", ["executor", "sglang-scheduler"])
def test_killed_execution_process_fails_its_requests_and_is_restarted(agent, client, reference, which):
    [old] = agent.executors()
    victim = _victim(old, which)
    rid = 50 if which == "executor" else 52
    client.send(_submit(rid, PROMPTS[1], max_tokens=3000))
    first = client.recv()
    assert first["type"] == "tokens" and first["items"][0]["id"] == rid, first
    victim.send_signal(signal.SIGKILL)
    while (m := client.recv())["type"] == "tokens":
        assert not any(it["finished"] for it in m["items"]), m
    assert (m["type"], m["id"], m["code"]) == ("error", rid, "worker_died"), m
    assert f"pid {old.pid}" in m["message"] and "device 0" in m["message"], m
    # The next request is served by a new process (held by the agent until it is ready).
    client.send(_submit(rid + 1, PROMPTS[2]))
    items, terminal = client.run_to_end({rid + 1})
    assert terminal[rid + 1]["type"] == "tokens", terminal
    assert [t for it in items[rid + 1] for t in it["tokens"]] == reference.result()[2]
    [new] = agent.executors()
    assert new.pid != old.pid
    assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE


def test_sigterm_fails_in_flight_requests_and_leaves_no_process(agent, client):
    client.send(_submit(60, PROMPTS[0], max_tokens=3000))
    assert client.recv()["type"] == "tokens"
    tree = [psutil.Process(agent.popen.pid)]
    for ex in agent.executors():
        tree += [ex, *ex.children(recursive=True)]
    assert len(tree) >= 3, tree  # agent, executor, SGLang's scheduler at least
    agent.popen.send_signal(signal.SIGTERM)
    while (m := client.recv())["type"] == "tokens":
        pass
    assert (m["type"], m["id"], m["code"]) == ("error", 60, "worker_died") and "shutting down" in m["message"], m
    assert agent.popen.wait(timeout=60) == 0
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, alive
