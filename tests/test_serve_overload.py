"""Overload through `tiertp serve` on CPU: the production gateway and worker
shed what cannot meet its SLO, and every request gets an answer.

One serve (tiny-llama, two devices, two tiers), planned from a GPU profile:
its budgets are far beyond what the CPU engine does under a burst, so:
- the gateway sheds at the door what the tier's plan has no SLO budget for
  (503 `overloaded`, Retry-After);
- the worker sheds queued requests whose TTFT deadline passed before they
  could start (`slo_unattainable`: 503, Retry-After) instead of running
  them late;
- nothing is lost: each request completes or gets one of those answers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from test_serve_control import started_with_tiers
from tier_files import tier_text

pytestmark = pytest.mark.slow

TIERS = tier_text("serve-overload")
BURST = 48


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    # One device per tier: each tier has a group of its own.
    yield from started_with_tiers(tmp_path_factory.mktemp("serve-overload"), TIERS, ("--devices", "2"))


def _post(serve, key: str, i: int) -> httpx.Response:
    # Long prompts (token ids) so the burst is far beyond what the device
    # prefills within the TTFT.
    body = {"model": "tiny-llama", "prompt": [5 + (i + k) % 200 for k in range(600)], "max_tokens": 4,
            "temperature": 0}
    return httpx.post(f"{serve.url}/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=180)


def _burst(serve) -> tuple[list, list, list]:
    """One burst: every request answered (200 with its tokens, or 503
    `overloaded` with Retry-After); returns (served, shed at the door, shed
    past its deadline)."""
    jobs = [("sk-tight", i) for i in range(BURST)] + [("sk-queued", i) for i in range(2 * BURST)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: _post(serve, *job), jobs))
    ok = [r for r in answers if r.status_code == 200]
    shed = [r for r in answers if r.status_code == 503]
    assert len(ok) + len(shed) == len(jobs), [(r.status_code, r.text) for r in answers if r.status_code not in (200, 503)]
    for r in shed:
        assert r.json()["error"]["code"] == "overloaded", r.text
        assert int(r.headers["retry-after"]) >= 1, r.headers
    for r in ok:
        assert r.json()["usage"]["completion_tokens"] == 4
    at_door = [r for r in shed if "SLO capacity" in r.json()["error"]["message"]]
    late = [r for r in shed if "slo_unattainable" in r.json()["error"]["message"]]
    assert len(at_door) + len(late) == len(shed)
    print(f"{len(jobs)} requests: served {len(ok)}, shed at the door {len(at_door)}, shed past deadline {len(late)}")
    return ok, at_door, late


def test_a_burst_is_served_or_shed_with_retry_after_and_nothing_is_lost(serve):
    # `tight`: the plan's budget (planned from a GPU profile) is soon spent,
    # so the gateway sheds at the door; `queued`: its looser TTFT gives a
    # budget far beyond what the CPU device starts in time, so admitted
    # requests wait past their deadline in the worker's queue. How many
    # reach the worker before the door's budget is spent depends on the
    # host's timing (about one burst in four sheds none late on a 2-core
    # host, before and after the planner saw prompt lengths; three bursts
    # in a row shed none late once in a full CI run under load), so up to
    # five bursts, each checked in full, until both kinds of shed were seen.
    ok, at_door, late = [], [], []
    for _ in range(5):
        served, door, past_deadline = _burst(serve)
        ok, at_door, late = ok + served, at_door + door, late + past_deadline
        if ok and at_door and late:
            break
    assert ok, "nothing was served"
    assert at_door, "the gateway shed nothing at the door"
    assert late, "the worker shed nothing past its deadline"
    metrics = httpx.get(serve.url.removesuffix("/v1") + "/metrics", timeout=10).text
    door = sum(int(float(ln.split()[-1])) for ln in metrics.splitlines() if ln.startswith("tiertp_shed_total{"))
    assert door == len(at_door), metrics


def test_after_the_burst_requests_are_served_again(serve):
    for key in ("sk-tight", "sk-queued"):
        r = _post(serve, key, 0)
        assert r.status_code == 200, r.text
