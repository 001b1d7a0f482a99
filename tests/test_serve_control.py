"""`tiertp serve` on CPU, the parts beyond the OpenAI surface: a tier over its
limits (from the tier file) gets the SDK's RateLimitError with Retry-After,
and a plan the control loop decides reaches the real node agent as
`apply_plan` and shows in the agent's own `stats` and in `/v1/plan`.

One serve (tiny-llama, one device, a short control window, a profile file
given with --profile), started once for the module; the agent's ZeroMQ port
and control-plane key are chosen here so the test can ask the agent directly.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from test_serve_openai import MODEL, started

from tiertp.profiles import resolve
from tiertp.worker.key_file import load_key_file, write_key_file
from tiertp.worker.stats_query import ask_stats
from tiertp.ports import free_port
from tier_files import tier_text

pytestmark = pytest.mark.slow

TIERS = tier_text("serve-control")
KEYS = {"chat": "sk-chat", "agent": "sk-agent"}
WAIT_S = 120




def started_with_tiers(tmp, tiers_text: str, args: tuple[str, ...] = ()):
    """A generator for module fixtures: `started` with this tier file, the
    H100 Llama-3.1-8B profile, a 0.25 s window and the agent on a port and
    with a key chosen here (`serve.agent_endpoint`, `serve.agent_key`, for `agent_stats`)."""
    tiers = tmp / "tiers.toml"
    tiers.write_text(tiers_text)
    key_file = tmp / "control.key"
    write_key_file(key_file)
    port = free_port()
    profile = resolve("h100", "llama-3.1-8b")
    s = started(tmp, ("--tiers", str(tiers), "--window", "0.25", "--worker-port", str(port),
                      "--profile", str(profile), "--key-file", str(key_file), *args))
    serve = next(s)
    assert f"profile {profile}" in "".join(serve.lines)
    serve.agent_endpoint, serve.agent_key = f"tcp://127.0.0.1:{port}", load_key_file(key_file)
    yield serve
    next(s, None)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    yield from started_with_tiers(tmp_path_factory.mktemp("serve-control"), TIERS)


def client(serve, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=serve.url, api_key=key, max_retries=0, timeout=60)


def agent_stats(serve) -> dict:
    """The agent's `stats`, asked over the worker protocol as any client holding its key may."""
    return ask_stats(serve.agent_endpoint, serve.agent_key, timeout_s=30.0)


def gateway_plan(serve) -> dict:
    return httpx.get(f"{serve.url}/plan", timeout=30).json()


def test_a_planned_tier_change_reaches_the_agent(serve):
    # First in the module: no request has reached the gateway yet (the
    # warm-up goes to the agent directly), so the idle plan gives the one device to a tier; the agent runs it.
    plan = gateway_plan(serve)
    assert [g["first_gpu"] for g in plan["groups"]] == [0]
    first = plan["groups"][0]["tier"]
    stats = agent_stats(serve)
    assert stats["plan_id"] == plan["plan_id"] == plan["workers"][0]["applied_plan_id"]
    assert stats["devices"][0]["tier"] == first
    # Load only on the other SLO tier: the control loop moves the device to it
    # (a role/tier change at TP1) and sends the plan to the agent. Their SLOs
    # cross (chat's TTFT is tighter, agent's TPOT), so the idle tier's group
    # cannot serve the other as its pool.
    other = "agent" if first == "chat" else "chat"
    c = client(serve, KEYS[other])
    deadline = time.monotonic() + WAIT_S
    while True:
        assert c.completions.create(model=MODEL, prompt="hello there", max_tokens=2).usage
        plan = gateway_plan(serve)
        moved = plan["groups"][0]["tier"] == other and plan["workers"][0]["applied_plan_id"] == plan["plan_id"]
        if moved:
            break
        assert time.monotonic() < deadline, f"the plan never moved the device to {other}: {plan}"
        time.sleep(0.3)
    stats = agent_stats(serve)
    assert stats["plan_id"] >= plan["plan_id"] > 1
    device = stats["devices"][0]
    assert device["tier"] == other
    assert (device["role"], device["tp_group"]) == (plan["groups"][0]["role"], [0, 1])
    # Requests still run after the change, on the tier that now owns the device.
    assert c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2).usage


def test_tier_over_its_rate_limit_gets_429_with_retry_after(serve):
    trial = client(serve, "sk-trial")
    r = trial.completions.create(model=MODEL, prompt="hello", max_tokens=1)
    assert r.usage is not None
    # One request per minute: the next one within the minute is refused.
    with pytest.raises(openai.RateLimitError) as e:
        trial.completions.create(model=MODEL, prompt="hello", max_tokens=1)
    assert e.value.status_code == 429
    assert e.value.code == "rate_limit_exceeded"
    assert "max_requests_per_minute" in str(e.value)
    retry_after = int(e.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 60
    # The limit is the tier's own: another tier's key still gets through.
    assert client(serve, "sk-chat").completions.create(model=MODEL, prompt="hello", max_tokens=1).usage
