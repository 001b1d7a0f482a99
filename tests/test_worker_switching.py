"""TP switching, and prefill -> decode hand-offs the client tells the node agent to make.

One real `tiertp worker` (tiny-llama, 3 CPU devices, TP levels 1 and 2: a
warm process for TP1 on every device and for TP2 on devices 0-1, all of a
device's processes mapping one shared weight store) and a real ZeroMQ
client. Plans change TP groups while requests decode; every request's
greedy output must equal SGLang's own (the reference), whatever moved.
Tests run in file order and share the agent.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections import defaultdict

import psutil
import pytest
from agent_harness import AgentProcess, Client, _submit, client, stop_agent
from sglang_generate import ISOLATED_ENV, generate_ids

from tiertp.engine.isolated import run_isolated

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
KV_TOKENS = 192  # per process: two 100-token requests fit in TP1 each, not together in TP2
SHORT = [[1, 2, 3, 4, 5], [100, 200, 300], [42] * 8, [7, 8, 9, 10]]
SHORT_MAX = 40
LONG = [list(range(300, 400)), list(range(500, 600))]
LONG_MAX = 90


@pytest.fixture(scope="module")
def reference():
    pool = concurrent.futures.ThreadPoolExecutor(1)
    short = pool.submit(run_isolated, generate_ids,
                        {"model": MODEL, "input_ids": SHORT, "max_tokens": SHORT_MAX}, timeout_s=300, env=ISOLATED_ENV)
    long = pool.submit(run_isolated, generate_ids,
                       {"model": MODEL, "input_ids": LONG, "max_tokens": LONG_MAX}, timeout_s=300, env=ISOLATED_ENV)
    yield {"short": short, "long": long}
    pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def agent(tmp_path_factory, reference):
    proc = AgentProcess(tmp_path_factory.mktemp("agent"), MODEL, devices=3,
                        extra=("--tp-levels", "1,2", "--max-total-tokens", str(KV_TOKENS)))
    yield proc
    stop_agent(proc)


class Streams:
    """Token items per request id, collected while waiting for other replies."""

    def __init__(self, client: Client):
        self.client = client
        self.tokens: dict[int, list[int]] = defaultdict(list)
        self.ended: dict[int, dict] = {}
        self.handed_off: dict[int, dict] = {}  # the answer to each `hand_off`

    def _take(self, m: dict) -> None:
        if m["type"] == "tokens":
            for it in m["items"]:
                assert it["id"] not in self.ended, f"item after the end: {it}"
                self.tokens[it["id"]] += it["tokens"]
                if it["finished"]:
                    self.ended[it["id"]] = it
        elif m["type"] == "error" and m.get("id") is not None:
            self.ended[m["id"]] = m
        elif m["type"] == "handed_off":
            self.handed_off[m["id"]] = m
        else:
            pytest.fail(f"unexpected message {m}")

    def until(self, kind: str) -> dict:
        """The next message of type `kind`, streams recorded meanwhile."""
        while (m := self.client.recv())["type"] != kind:
            self._take(m)
        return m

    def until_tokens(self, ids, n: int = 1) -> None:
        while any(len(self.tokens[i]) < n and i not in self.ended for i in ids):
            self._take(self.client.recv())

    def to_end(self, ids) -> None:
        while not set(ids) <= set(self.ended):
            self._take(self.client.recv())
        errors = {i: m for i, m in self.ended.items() if i in ids and m.get("type") == "error"}
        assert not errors, errors


def _plan(plan_id: int, *devices) -> dict:
    return {"type": "apply_plan", "plan_id": plan_id, "devices": [
        {"device": d, "role": role, "tier": "chat", "tp_group": list(group), "batch_cap": 8, "token_cap": 0}
        for d, role, group in devices]}


def _apply(streams: Streams, plan: dict) -> dict:
    streams.client.send(plan)
    return streams.until("plan_applied")


def _stats(streams: Streams) -> dict:
    streams.client.send({"type": "stats"})
    return streams.until("stats")


TP1_EACH = [(0, "colocated", (0, 1)), (1, "colocated", (1, 1)), (2, "colocated", (2, 1))]
TP2_PAIR = [(0, "colocated", (0, 2)), (1, "colocated", (0, 2)), (2, "colocated", (2, 1))]


def test_every_device_maps_one_weight_copy_for_all_its_tp_levels(agent, client):
    _wait_ready(client, agent)
    stores_by_device: dict[int, set[str]] = defaultdict(set)
    for ex in agent.executors():
        cmd = ex.cmdline()
        first = int(cmd[cmd.index("--first-device") + 1])
        for child in ex.children(recursive=True):  # ranks are the forkserver's children
            m = re.search(r"tiertp::tp\d+_rank(\d+)", " ".join(child.cmdline()))
            if not m:
                continue
            maps = {mm.path for mm in child.memory_maps() if "tiertp-weights-" in mm.path}
            assert len(maps) == 1, (child, maps)
            stores_by_device[first + int(m.group(1))] |= maps
    # devices 0 and 1 have a TP1 and a TP2 rank each, device 2 a TP1 rank: one store per device
    assert sorted(stores_by_device) == [0, 1, 2]
    assert all(len(paths) == 1 for paths in stores_by_device.values()), stores_by_device
    assert len(set.union(*stores_by_device.values())) == 3


def _wait_ready(client: Client, agent: AgentProcess) -> None:
    """Until every warm process is ready and can take part in switches."""
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        procs = client.request({"type": "stats"})["processes"]
        if len(procs) == 4 and all(p["state"] == "ready" and p["switchable"] for p in procs):
            return
        time.sleep(1)
    pytest.fail(f"processes not ready in time: {procs}\n{agent.log_tail()}")


def test_merge_and_split_mid_generation_keep_greedy_output(client, reference):
    streams = Streams(client)
    ids = [100 + i for i in range(len(SHORT))]
    for i, prompt in zip(ids, SHORT):
        client.send(_submit(i, prompt, max_tokens=SHORT_MAX))
    streams.until_tokens(ids, n=2)
    m = _apply(streams, _plan(1, *TP2_PAIR))
    assert (m["ok"], m["reason"]) == (True, None), m
    s = _stats(streams)
    assert [d["tp_group"] for d in s["devices"]] == [[0, 2], [0, 2], [2, 1]]
    assert s["moves"]["switches"] == 1
    streams.until_tokens(ids, n=8)
    m = _apply(streams, _plan(2, *TP1_EACH))
    assert (m["ok"], m["reason"]) == (True, None), m
    streams.to_end(ids)
    assert [streams.tokens[i] for i in ids] == reference["short"].result()
    s = _stats(streams)
    assert [d["tp_group"] for d in s["devices"]] == [[0, 1], [1, 1], [2, 1]]
    assert s["moves"]["switches"] == 2  # the merge, then the split


def test_switch_that_does_not_fit_rolls_back_and_requests_continue(client, reference):
    streams = Streams(client)
    before = _stats(streams)
    ids = [200, 201]
    for i, prompt in zip(ids, LONG):
        client.send(_submit(i, prompt, max_tokens=LONG_MAX))
    streams.until_tokens(ids, n=2)
    # Two 100-token requests, one per TP1 device; the TP2 process has KV for 192 tokens.
    m = _apply(streams, _plan(3, *TP2_PAIR))
    assert m["ok"] is False and "rolled back" in m["reason"] and "KV" in m["reason"], m
    s = _stats(streams)
    assert s["plan_id"] == before["plan_id"]
    assert [d["tp_group"] for d in s["devices"]] == [[0, 1], [1, 1], [2, 1]]
    assert s["moves"]["rolled_back"] == before["moves"]["rolled_back"] + 1
    streams.to_end(ids)
    assert [streams.tokens[i] for i in ids] == reference["long"].result()


@pytest.mark.parametrize("prefill, decode", [
    ([(0, "prefill", (0, 2)), (1, "prefill", (0, 2))], [(2, "decode", (2, 1))]),  # TP2 -> TP1
    ([(2, "prefill", (2, 1))], [(0, "decode", (0, 2)), (1, "decode", (0, 2))]),  # TP1 -> TP2
])
def test_prefill_group_hands_requests_off_to_the_decode_group(client, reference, prefill, decode):
    streams = Streams(client)
    m = _apply(streams, _plan(10 + len(prefill), *prefill, *decode))
    assert (m["ok"], m["reason"]) == (True, None), m
    before = _stats(streams)["moves"]
    ids = [300 + 10 * len(prefill) + i for i in range(len(SHORT))]
    for i, prompt in zip(ids, SHORT):
        client.send(_submit(i, prompt, max_tokens=SHORT_MAX))
    # Prefilled (a first token is out): the client decides the move, as the gateway's control loop does.
    streams.until_tokens(ids, n=1)
    dest = list(decode[0][2])
    for i in ids:
        client.send({"type": "hand_off", "id": i, "group": dest})
    streams.to_end(ids)
    assert [streams.tokens[i] for i in ids] == reference["short"].result()
    after = _stats(streams)["moves"]  # every hand_off is answered before this stats
    assert after["handed_off_requests"] - before["handed_off_requests"] == len(ids)
    assert [(streams.handed_off[i]["group"], streams.handed_off[i]["ok"]) for i in ids] == [(dest, True)] * len(ids)


def test_submit_naming_an_inactive_group_is_routed_by_tier(client, reference):
    # e.g. the gateway's plan is not the one running here (the agent rejected it)
    streams = Streams(client)
    active = {tuple(d["tp_group"]) for d in _stats(streams)["devices"]}
    assert (1, 1) not in active
    client.send(_submit(400, SHORT[0], max_tokens=SHORT_MAX, group=[1, 1]))
    streams.to_end([400])
    assert streams.tokens[400] == reference["short"].result()[0]


def test_plan_switching_into_a_restarting_process_is_rejected(agent, client):
    streams = Streams(client)
    m = _apply(streams, _plan(20, *TP1_EACH))  # back to TP1 everywhere
    assert m["ok"] is True, m
    [tp2] = [ex for ex in agent.executors() if ex.cmdline()[ex.cmdline().index("--tp") + 1] == "2"]
    tp2.kill()
    psutil.wait_procs([tp2], timeout=30)
    time.sleep(1)  # the agent's next tick sees the death and starts a new TP2 process
    m = _apply(streams, _plan(21, *TP2_PAIR))
    assert m["ok"] is False and "not ready" in m["reason"], m
    s = _stats(streams)
    assert s["plan_id"] == 20 and [d["tp_group"] for d in s["devices"]] == [[0, 1], [1, 1], [2, 1]]
