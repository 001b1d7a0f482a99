"""The live replay client's accounting against a fake OpenAI server
(aiohttp.web in a thread): every request ends completed or failed with the
right reason (HTTP errors, errors inside the stream, broken streams, time
limits, a server that dies), and `tiertp replay --live` writes the report."""

from __future__ import annotations

import asyncio
import csv
import json
import math
import threading

import aiohttp
import pytest
from aiohttp import web

from tiertp.replay.live.caps import LengthCaps
from tiertp.replay.live.client import request_body, send_one
from tiertp.replay.live.limits import Limits
from tiertp.replay.live.prompts import FILLER, PromptMaker
from tiertp.replay.live.records import RequestRecord, to_sim_result
from tiertp.replay.workload import TierRule

MODEL = "fake-model"


class FakeServer:
    """An OpenAI-style server whose /v1/completions behaviour is chosen per
    request by `behaviour(n, body)` (n counts requests from 0):
    ok, http429, stream_error, close_mid, slow_first, stall, not_sse, die."""

    def __init__(self, behaviour, token_delay_s: float = 0.002):
        self.behaviour = behaviour
        self.token_delay_s = token_delay_s
        self.count = 0
        self.bodies: list[dict] = []
        self.keys: list[str] = []
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped = False
        threading.Thread(target=self._run, daemon=True).start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/plan", self.plan)
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)

    async def models(self, _req):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def plan(self, _req):
        return web.json_response({"plan_id": 1, "num_gpus": 2, "groups": [
            {"tier": "chat", "role": "colocated", "tp": 1, "first_gpu": 0, "batch_cap": 8},
            {"tier": "agent", "role": "colocated", "tp": 1, "first_gpu": 1, "batch_cap": 8}]})

    async def completions(self, req: web.Request):
        body = await req.json()
        n = self.count
        self.count += 1
        self.bodies.append(body)
        self.keys.append(req.headers.get("Authorization", ""))
        kind = self.behaviour(n, body)
        if kind == "http429":
            return web.json_response({"error": {"message": "tier chat is over its limit", "type": "rate_limit_error",
                                                "param": None, "code": "rate_limit_exceeded"}}, status=429)
        if kind == "not_sse":
            return web.json_response({"choices": [{"text": "x"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)

        async def send(obj) -> None:
            await resp.write(f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode())

        if kind == "slow_first":
            await asyncio.sleep(5)
        if kind == "stream_error":
            await send({"error": {"message": "worker 0 died", "type": "server_error", "code": "worker_died"}})
            await send("[DONE]")
            return resp
        n_tokens = body["max_tokens"]
        for i in range(n_tokens):
            if kind in ("close_mid", "die") and i == 2:
                if kind == "die":
                    self.loop.call_soon(lambda: asyncio.ensure_future(self.runner.cleanup()))
                req.transport.close()
                return resp
            if kind == "stall" and i == 1:
                await asyncio.sleep(5)
            await asyncio.sleep(self.token_delay_s)
            last = i == n_tokens - 1
            await send({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                        "choices": [{"index": 0, "text": " tok", "finish_reason": "length" if last else None}]})
        await send({"id": "cmpl-1", "object": "text_completion", "choices": [],
                    "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n_tokens,
                              "total_tokens": len(body["prompt"]) + n_tokens}})
        await send("[DONE]")
        return resp


@pytest.fixture()
def server_factory():
    servers = []

    def make(behaviour, **kw):
        servers.append(FakeServer(behaviour, **kw))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


def send(server: FakeServer, max_tokens: int = 5, limits: Limits = Limits()) -> RequestRecord:
    rec = RequestRecord(0, "chat", 3, max_tokens, 0.0)

    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with aiohttp.ClientSession() as session:
            await send_one(session, server.url[:-3] + "/v1/completions", "sk-test",
                           request_body(MODEL, [5, 6, 7], max_tokens), rec, limits, lambda: loop.time() - t0)

    asyncio.run(go())
    return rec


def test_completed_request_records_tokens_and_latencies(server_factory):
    server = server_factory(lambda n, b: "ok", token_delay_s=0.01)
    rec = send(server, max_tokens=5)
    assert rec.status == "completed" and rec.failure is None
    assert rec.completion_tokens == 5 and rec.finish_reason == "length"
    assert rec.ttft_ms > 0 and rec.tpot_ms > 0 and rec.end_s >= rec.first_token_s >= rec.sent_s
    body = server.bodies[0]
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 5 and body["stream"] is True
    assert server.keys[0] == "Bearer sk-test"


@pytest.mark.parametrize("kind, failure, status, etype", [
    ("http429", "http", 429, "rate_limit_error"),
    ("stream_error", "stream_error", None, "server_error"),
    ("close_mid", "connection", None, None),
    ("not_sse", "protocol", 200, None),
])
def test_failures_carry_their_reason(server_factory, kind, failure, status, etype):
    rec = send(server_factory(lambda n, b: kind))
    assert rec.status == "failed"
    assert rec.failure.kind == failure
    assert rec.failure.http_status == status and rec.failure.error_type == etype
    assert rec.failure.message
    assert to_sim_result([rec])["rejected_why"] == [rec.failure.label()]


def test_time_limits_fail_slow_requests_with_a_clear_reason(server_factory):
    rec = send(server_factory(lambda n, b: "slow_first"), limits=Limits(first_token_s=0.5))
    assert rec.failure.kind == "timeout" and "no first token within 0.5 s" in rec.failure.message
    rec = send(server_factory(lambda n, b: "stall"), limits=Limits(stall_s=0.5))
    assert rec.failure.kind == "timeout" and "silent for 0.5 s after 1 token" in rec.failure.message


def test_nothing_listening_is_a_connection_failure(server_factory):
    server = server_factory(lambda n, b: "ok")
    server.stop()
    rec = send(server)
    assert rec.status == "failed" and rec.failure.kind == "connection"


def test_prompts_are_exact_length_and_differ_per_request():
    maker = PromptMaker(list(range(100, 140)), 10, 1000, seed=3)
    for n in (1, 4, 5, 77, 300):
        assert len(maker.ids(7, n)) == n
    assert maker.ids(7, 50) == maker.ids(7, 50)
    assert maker.ids(7, 50)[:4] != maker.ids(8, 50)[:4]


def test_open_records_are_refused():
    with pytest.raises(RuntimeError, match="never ended"):
        to_sim_result([RequestRecord(0, "chat", 3, 4, 0.0)])


def test_caps_cut_lengths_and_are_described():
    from tiertp.traces import make_trace

    t = make_trace("t", [0, 1, 2], [10, 500, 30], [1, 200, 5], tier=[0, 0, 0], tier_names=["chat"])
    caps = LengthCaps(100, 50)
    c = caps.apply(t)
    assert c.prompt_tokens.tolist() == [10, 100, 30] and c.output_tokens.tolist() == [1, 50, 5]
    assert caps.describe(t) == {"max_prompt_tokens": 100, "max_output_tokens": 50, "prompts_capped": 1,
                                "outputs_capped": 1}


@pytest.fixture()
def tokenizer_dir(tmp_path):
    """A word-level tokenizer.json over the filler's words (no model needed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for w in FILLER.replace(",", " ").replace(".", " ").split()})
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def tiers_file(tmp_path):
    path = tmp_path / "tiers.toml"
    path.write_text('[[tier]]\nname = "chat"\nttft_ms = 1000\ntpot_ms = 100\napi_keys = ["sk-chat"]\n'
                    '[[tier]]\nname = "agent"\nttft_ms = 5000\ntpot_ms = 500\napi_keys = ["sk-agent"]\n')
    return path


def live_config(tmp_path, url, tokenizer_dir, **kw):
    from tiertp.replay.live import LiveReplayConfig

    base = dict(url=url, traces=["synthetic:poisson,rate=20,prompt=50,output=6,duration=2,seed=1"],
                tiers_path=tiers_file(tmp_path), out=tmp_path / "report",
                tier_rule=TierRule(fractions={"chat": 0.5, "agent": 0.5}), caps=LengthCaps(40, 4),
                limits=Limits(first_token_s=3, stall_s=3, total_s=10), tokenizer=str(tokenizer_dir), progress=False)
    base.update(kw)
    return LiveReplayConfig(**base)


def test_live_replay_accounts_for_every_request_and_writes_the_report(server_factory, tmp_path, tokenizer_dir):
    from tiertp.replay.live import live_replay

    cycle = ["ok", "ok", "http429", "stream_error", "close_mid", "ok", "ok"]
    server = server_factory(lambda n, b: cycle[n % len(cycle)])
    cfg = live_config(tmp_path, server.url, tokenizer_dir)
    report = live_replay(cfg)
    n = server.count
    assert n == len(report.results[0].load.trace) > 10
    # every prompt honours the cap, exactly, and each tier used its key
    assert all(len(b["prompt"]) <= 40 and b["max_tokens"] <= 4 for b in server.bodies)
    assert set(server.keys) == {"Bearer sk-chat", "Bearer sk-agent"}
    live = report.results[0].policies["live"].best.live
    assert live["completed"] + live["failed"] == n
    assert live["failed"] == sum(1 for i in range(n) if cycle[i % len(cycle)] not in ("ok",))
    assert set(live["failures"]) <= {"http:429:rate_limit_error", "stream_error:server_error", "connection"}
    doc = json.loads((cfg.out / "report.json").read_text())
    assert doc["command"] == "tiertp replay --live" and doc["length_caps"] == {"max_prompt_tokens": 40,
                                                                                "max_output_tokens": 4}
    entry = doc["loads"][0]["policies"]["live"]
    assert entry["requests"] == n and entry["completed"] == live["completed"]
    assert entry["live"]["length_caps"]["max_prompt_tokens"] == 40
    rows = list(csv.DictReader(open(cfg.out / "report.csv")))
    assert {r["tier"] for r in rows} == {"chat", "agent"}
    per_request = list(csv.DictReader(open(next(cfg.out.glob("requests-*.csv")))))
    assert len(per_request) == n
    assert all(r["status"] in ("completed", "failed") for r in per_request)
    assert all(r["failure_kind"] for r in per_request if r["status"] == "failed")
    assert all(p.stat().st_size > 0 for p in cfg.out.glob("*.png"))
    assert len(list(cfg.out.glob("*.png"))) == 3


def test_a_server_that_dies_fails_the_rest_with_connection_errors(server_factory, tmp_path, tokenizer_dir):
    from tiertp.replay.live import live_replay

    server = server_factory(lambda n, b: "die" if n == 5 else "ok")
    report = live_replay(live_config(tmp_path, server.url, tokenizer_dir, plots=False))
    outcome = report.results[0].policies["live"].best
    n = len(report.results[0].load.trace)
    assert outcome.live["completed"] + outcome.live["failed"] == n
    assert outcome.live["completed"] >= 1 and outcome.live["failed"] >= n - 6
    assert set(outcome.live["failures"]) == {"connection"}
    assert all(r.done for r in outcome.records)
    assert all(math.isfinite(r.end_s) for r in outcome.records)


def test_an_interrupted_replay_fails_what_it_did_not_finish(server_factory):
    from tiertp.replay.live.run import _replay
    from tiertp.replay.live.server import discover
    from tiertp.replay.workload import Load
    from tiertp.traces import make_trace

    server = server_factory(lambda n, b: "stall")
    trace = make_trace("t", [0.0, 0.1, 0.2, 30.0], [5] * 4, [3] * 4, tier=[0] * 4, tier_names=["chat"])
    maker = PromptMaker(list(range(100, 140)), 10, 1000)

    async def go():
        task = asyncio.create_task(_replay(discover(server.url), Load(None, trace, 31.0), ["chat"],
                                           {"chat": "sk"}, maker, Limits(stall_s=20), None, 1.0))
        await asyncio.sleep(1.5)
        task.cancel()  # what asyncio.run does on Ctrl-C
        return await task

    run = asyncio.run(go())
    assert run.interrupted
    assert all(r.status == "failed" and r.failure.kind == "cancelled" for r in run.records)
    assert "before the request was sent" in run.records[3].failure.message
    assert "in flight" in run.records[0].failure.message
