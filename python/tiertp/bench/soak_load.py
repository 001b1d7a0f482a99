"""A soak's load: Poisson arrivals of streamed chat requests through the
official `openai` client, each ending in exactly one outcome."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import openai

COMPLETED_IN_SLO = "completed_in_slo"
COMPLETED_LATE = "completed_late"
FAILED = "failed"
LOST = "lost"
OUTCOMES = (COMPLETED_IN_SLO, COMPLETED_LATE, FAILED, LOST)


@dataclass(frozen=True)
class TierLoad:
    """One tier as a client sees it: its key and SLOs."""

    name: str
    api_key: str
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Outcome:
    tier: str
    kind: str  # one of OUTCOMES
    reason: str  # the error for failed and lost requests, else ""


def classify(tier: TierLoad, ttft_s: float | None, tpot_s: float | None, finished: bool, error: str | None,
             timed_out: bool) -> Outcome:
    """The one outcome of a request: lost when no answer came in time (or the
    stream just stopped), failed when the server said why, else completed,
    in its SLO or late."""
    if timed_out:
        return Outcome(tier.name, LOST, error or "no answer within the request timeout")
    if error is not None:
        return Outcome(tier.name, FAILED, error)
    if not finished:
        return Outcome(tier.name, LOST, "the stream ended without a finish reason or an error")
    late = ttft_s is None or ttft_s > tier.ttft_s or (tpot_s or 0.0) > tier.tpot_s
    return Outcome(tier.name, COMPLETED_LATE if late else COMPLETED_IN_SLO, "")


def _reason(e: openai.APIError) -> str:
    status = getattr(e, "status_code", None)
    return f"{status} {e.message}" if status else e.message


def stream_one(url: str, model: str, tier: TierLoad, prompt: str, max_tokens: int, timeout_s: float) -> Outcome:
    client = openai.OpenAI(base_url=url, api_key=tier.api_key, max_retries=0, timeout=timeout_s)
    start = time.monotonic()
    first = last = None
    tokens = 0
    finished = False
    try:
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=max_tokens, temperature=0, stream=True)
        for chunk in stream:
            now = time.monotonic()
            if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                first = first if first is not None else now
                last = now
                tokens += 1
            if chunk.choices and chunk.choices[0].finish_reason:
                finished = True
    except openai.APITimeoutError as e:
        return classify(tier, None, None, False, f"timeout: {e.message}", timed_out=True)
    except openai.APIError as e:
        return classify(tier, None, None, False, _reason(e), timed_out=False)
    ttft = None if first is None else first - start
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return classify(tier, ttft, tpot, finished, None, timed_out=False)


class Load:
    """Poisson arrivals at `rps` until `stop`, each request on a pool thread."""

    def __init__(self, url: str, model: str, tiers: list[TierLoad], rps: float, max_tokens: tuple[int, int],
                 timeout_s: float, seed: int):
        self.url, self.model, self.tiers, self.rps = url, model, tiers, rps
        self.max_tokens, self.timeout_s = max_tokens, timeout_s
        self.rng = random.Random(seed)
        self.pool = ThreadPoolExecutor(max_workers=64)
        self.futures: list[Future] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._arrivals, daemon=True)
        self.thread.start()

    def _arrivals(self) -> None:
        n = 0
        while not self.stopped.wait(self.rng.expovariate(self.rps)):
            tier = self.rng.choice(self.tiers)
            n += 1
            prompt = f"request {n}: tell me about the number {self.rng.randint(1, 10_000)}"
            self.futures.append(self.pool.submit(stream_one, self.url, self.model, tier, prompt,
                                                 self.rng.randint(*self.max_tokens), self.timeout_s))

    def finish(self) -> list[Outcome]:
        """Stops sending; every request sent ends in an outcome: those with
        no answer by their timeout (and a grace period) are lost."""
        self.stopped.set()
        self.thread.join()
        outcomes = []
        for f in self.futures:
            try:
                outcomes.append(f.result(timeout=self.timeout_s + 30))
            except Exception as e:  # a hang past the timeout, or a bug in the client path
                outcomes.append(Outcome("?", LOST, f"{type(e).__name__}: {e}"))
        self.pool.shutdown(wait=False, cancel_futures=True)
        return outcomes
