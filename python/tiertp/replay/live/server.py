"""What the live replay asks the server before and while it replays: its
model name (/v1/models), its GPUs and configuration (/v1/plan, a tiertp
gateway extension), and the API key of each tier (from the tier TOML the
server was started with)."""

from __future__ import annotations

import asyncio
import json
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def base_url(url: str) -> str:
    """`http://host:port` from what a user may paste (`…/v1`, trailing slash)."""
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"--live {url!r}: expected an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1")
    return u[:-3] if u.endswith("/v1") else u


def get_json(url: str, timeout_s: float = 10.0, api_key: str | None = None):
    """GET a JSON document (blocking; used before the replay starts)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise ConnectionError(f"GET {url}: HTTP {e.code}: {e.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ConnectionError(f"GET {url}: {getattr(e, 'reason', e)}") from None


@dataclass(frozen=True)
class ServerInfo:
    base: str
    model: str
    gpus: int | None  # None: not a tiertp gateway (no /v1/plan)

    @property
    def completions_url(self) -> str:
        return f"{self.base}/v1/completions"

    @property
    def plan_url(self) -> str:
        return f"{self.base}/v1/plan"


def discover(url: str, model: str | None = None) -> ServerInfo:
    """The server at `url`: its model (the one it lists, or `model` when it
    lists several) and, from /v1/plan, its GPU count. ConnectionError when
    it does not answer."""
    base = base_url(url)
    listed = [m["id"] for m in get_json(f"{base}/v1/models").get("data", [])]
    if model is None:
        if len(listed) != 1:
            raise ValueError(f"the server lists models {listed}; choose one with --served-model")
        model = listed[0]
    elif model not in listed:
        raise ValueError(f"--served-model {model!r} is not served at {base}; it lists {listed}")
    try:
        gpus = int(get_json(f"{base}/v1/plan")["num_gpus"])
    except (ConnectionError, KeyError, TypeError, ValueError):
        gpus = None
    return ServerInfo(base, model, gpus)


def tier_api_keys(tiers_path: Path, tier_names: list[str], overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Tier name -> the API key the client sends for it: the first of the
    tier's `api_keys` in the TOML, unless `overrides` gives one."""
    data = tomllib.loads(Path(tiers_path).read_text())
    keys = {t.get("name"): (t.get("api_keys") or [None])[0] for t in data.get("tier", [])}
    keys.update(overrides or {})
    unknown = sorted(set(overrides or {}) - set(tier_names))
    if unknown:
        raise ValueError(f"--api-key names unknown tier(s) {unknown}; tiers: {tier_names}")
    missing = [t for t in tier_names if not keys.get(t)]
    if missing:
        raise ValueError(f"no API key for tier(s) {missing}: add api_keys to {tiers_path} or give --api-key TIER=KEY")
    return {t: keys[t] for t in tier_names}


@dataclass
class PlanWatcher:
    """Polls /v1/plan while the replay runs; `timeline` holds the gateway's
    configuration at each change, in the simulator's timeline format
    ({time_s, groups: [{tier, role, tp, first_gpu}]}). What the gateway
    planned: a worker that cannot apply a plan (e.g. a TP switch, which the
    workers reject today) keeps its old groups."""

    url: str
    period_s: float = 1.0
    timeline: list[dict] = field(default_factory=list)
    changes: int = 0
    errors: int = 0
    _plan_id: int | None = None

    async def run(self, session, clock) -> None:
        import aiohttp

        while True:
            try:
                async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=self.period_s * 5)) as r:
                    plan = await r.json()
                self._record(plan, clock())
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a missed poll only thins the timeline
                self.errors += 1
            await asyncio.sleep(self.period_s)

    def _record(self, plan: dict, now: float) -> None:
        pid = plan.get("plan_id")
        if pid == self._plan_id:
            return
        if self._plan_id is not None:
            self.changes += 1
        self._plan_id = pid
        groups = [{k: g[k] for k in ("tier", "role", "tp", "first_gpu")} for g in plan.get("groups", [])]
        self.timeline.append({"time_s": max(now, 0.0), "groups": groups,
                              "batch_caps": [g.get("batch_cap") for g in plan.get("groups", [])]})
