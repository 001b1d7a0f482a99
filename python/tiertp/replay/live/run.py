"""One load level replayed live: every request of the trace sent at its
(scaled) arrival time from one asyncio loop, the gateway's plan polled
beside them, and every request accounted for at the end."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from tiertp.replay.live.client import request_body, send_one
from tiertp.replay.live.limits import Limits
from tiertp.replay.live.prompts import PromptMaker
from tiertp.replay.live.records import FailureReason, RequestRecord
from tiertp.replay.live.server import PlanWatcher, ServerInfo
from tiertp.replay.workload import Load

log = logging.getLogger(__name__)

# Lead time between preparing the requests and the trace's time 0.
START_DELAY_S = 0.5


@dataclass
class LiveRun:
    """What one live load produced. `interrupted`: Ctrl-C stopped it (the
    requests it did not finish are failed as `cancelled`)."""

    records: list[RequestRecord]
    timeline: list[dict]
    plan_changes: int
    end_s: float
    wall_s: float
    interrupted: bool = False


async def _replay(info: ServerInfo, load: Load, tier_names: list[str], keys: dict[str, str], prompts: PromptMaker,
                  limits: Limits, on_done: Callable[[int], None] | None, plan_period_s: float) -> LiveRun:
    t = load.trace
    records = [RequestRecord(i, tier_names[int(tier)], int(p), int(o), float(a))
               for i, (a, tier, p, o) in enumerate(zip(t.arrival_s, t.tier, t.prompt_tokens, t.output_tokens))]
    bodies = [request_body(info.model, prompts.ids(r.index, r.prompt_tokens), r.max_tokens) for r in records]
    loop = asyncio.get_running_loop()
    wall0 = time.perf_counter()
    t0 = loop.time() + START_DELAY_S

    def clock() -> float:
        return loop.time() - t0

    # No connection limit: a client-side queue would delay sends and hide the server's queueing.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    watcher = PlanWatcher(info.plan_url, plan_period_s) if info.gpus is not None else None
    tasks: list[asyncio.Task] = []
    interrupted = False
    done = 0

    def finished(_task) -> None:
        nonlocal done
        done += 1
        if on_done:
            on_done(done)

    async with aiohttp.ClientSession(connector=connector) as session:
        poller = asyncio.create_task(watcher.run(session, clock)) if watcher else None
        try:
            for r, body in zip(records, bodies):
                delay = r.scheduled_s - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(send_one(session, info.completions_url, keys[r.tier], body, r, limits, clock))
                task.add_done_callback(finished)
                tasks.append(task)
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            interrupted = True
            log.warning("interrupted: cancelling %d request(s) in flight", sum(not x.done() for x in tasks))
            for x in tasks:
                x.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            if poller is not None:
                poller.cancel()
                await asyncio.gather(poller, return_exceptions=True)
    for r in records:
        if not r.done:
            r.fail(clock(), FailureReason("cancelled", "the replay was interrupted before the request was sent")
                   if interrupted else FailureReason("client", "the request never ended (a bug of the live client)"))
    return LiveRun(records, watcher.timeline if watcher else [], watcher.changes if watcher else 0,
                   end_s=max((r.end_s for r in records), default=0.0), wall_s=time.perf_counter() - wall0,
                   interrupted=interrupted)


def replay_load(info: ServerInfo, load: Load, tier_names: list[str], keys: dict[str, str], prompts: PromptMaker,
                limits: Limits, on_done: Callable[[int], None] | None = None, plan_period_s: float = 1.0) -> LiveRun:
    """Replay `load` against the server `info` describes; blocks until every
    request ended (or Ctrl-C: see LiveRun.interrupted)."""
    return asyncio.run(_replay(info, load, tier_names, keys, prompts, limits, on_done, plan_period_s))
