"""One streamed request against an OpenAI-compatible server (aiohttp):
send, follow the SSE stream, and end its RequestRecord completed or failed
with a reason. Nothing escapes `send_one` but cancellation (after the
record is closed as `cancelled`)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable

import aiohttp

from tiertp.replay.live.limits import Limits
from tiertp.replay.live.records import FailureReason, RequestRecord


def request_body(model: str, prompt_ids: list[int], max_tokens: int) -> bytes:
    """A streamed /v1/completions request. Greedy sampling: the output is
    reproducible and (see prompts.py) runs to max_tokens."""
    return json.dumps({
        "model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True},
    }).encode()


def openai_error(payload, status: int | None, kind: str) -> FailureReason:
    """A FailureReason from an OpenAI error body ({"error": {message, type, code}})."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        code = err.get("code")
        return FailureReason(kind, str(err.get("message") or "(no message)"), status,
                             err.get("type") and str(err["type"]), None if code is None else str(code))
    return FailureReason(kind, f"error body without an OpenAI `error` object: {str(payload)[:300]}", status)


class _Stream:
    """The state of one SSE stream being read."""

    def __init__(self, record: RequestRecord):
        self.record = record
        self.text_tokens = 0  # chunks that carried text: the token count when no usage arrives
        self.usage_tokens: int | None = None
        self.finish_reason: str | None = None
        self.finish_at: float | None = None
        self.done = False

    def on_data(self, data: str, now: float) -> FailureReason | None:
        if data == "[DONE]":
            self.done = True
            return None
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            return FailureReason("protocol", f"SSE data is not JSON: {data[:200]!r}")
        if not isinstance(obj, dict):
            return FailureReason("protocol", f"SSE data is not a JSON object: {data[:200]!r}")
        if "error" in obj:
            return openai_error(obj, None, "stream_error")
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        for choice in obj.get("choices") or []:
            text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if text or choice.get("finish_reason"):
                if math.isnan(self.record.first_token_s):  # the first one
                    self.record.first_token_s = now
                self.text_tokens += bool(text)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.finish_at = now
        return None

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else max(self.text_tokens, 1)


async def _read_line(resp: aiohttp.ClientResponse, timeout_s: float) -> bytes:
    return await asyncio.wait_for(resp.content.readline(), timeout=max(timeout_s, 0.0))


async def send_one(session: aiohttp.ClientSession, url: str, api_key: str, body: bytes, record: RequestRecord,
                   limits: Limits, clock: Callable[[], float]) -> None:
    """POST `body` to `url` (…/v1/completions) and follow the stream; ends
    `record` (completed, or failed with a reason) in every case."""
    record.sent_s = clock()
    first_deadline = record.sent_s + limits.first_token_s
    total_deadline = record.sent_s + limits.total_s
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
               "Accept": "text/event-stream"}

    def fail(reason: FailureReason) -> None:
        record.fail(clock(), reason)

    resp = None
    stream = _Stream(record)
    try:
        try:
            resp = await asyncio.wait_for(
                session.post(url, data=body, headers=headers,
                             timeout=aiohttp.ClientTimeout(total=None, sock_connect=limits.connect_s)),
                timeout=min(first_deadline, total_deadline) - clock())
        except asyncio.TimeoutError:
            return fail(FailureReason("timeout", f"no response headers within {limits.first_token_s:g} s of sending"))
        if resp.status != 200:
            try:
                text = await asyncio.wait_for(resp.text(), timeout=limits.stall_s)
                payload = json.loads(text)
            except (asyncio.TimeoutError, json.JSONDecodeError, UnicodeDecodeError, aiohttp.ClientError) as e:
                payload = f"(unreadable error body: {type(e).__name__})"
            return fail(openai_error(payload, resp.status, "http"))
        ctype = resp.headers.get("Content-Type", "")
        if not ctype.startswith("text/event-stream"):
            return fail(FailureReason("protocol", f"expected an SSE stream (text/event-stream), got {ctype!r}",
                                      resp.status))
        while not stream.done:
            now = clock()
            if stream.finish_at is None and math.isnan(record.first_token_s):
                wait, what = first_deadline - now, f"no first token within {limits.first_token_s:g} s of sending"
            else:
                wait, what = limits.stall_s, f"stream silent for {limits.stall_s:g} s after {stream.text_tokens} token(s)"
            if total_deadline - now < wait:
                wait, what = total_deadline - now, f"request not finished within {limits.total_s:g} s"
            try:
                line = await _read_line(resp, wait)
            except asyncio.TimeoutError:
                return fail(FailureReason("timeout", what))
            except ValueError as e:  # aiohttp: a line over its buffer limit
                return fail(FailureReason("protocol", f"SSE line too long: {e}"))
            if not line:  # EOF
                break
            line = line.decode("utf-8", errors="replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue  # blank separators, comments, event/id fields
            problem = stream.on_data(line[5:].lstrip(" "), clock())
            if problem is not None:
                return fail(problem)
        if stream.finish_at is None:
            how = "ended the stream" if stream.done else "closed the connection"
            kind = "protocol" if stream.done else "connection"
            return fail(FailureReason(kind, f"the server {how} after {stream.text_tokens} token(s) without a "
                                            "finish_reason"))
        record.complete(stream.finish_at, stream.tokens, stream.finish_reason)
    except asyncio.CancelledError:
        if not record.done:
            fail(FailureReason("cancelled", "the replay was interrupted while the request was in flight"))
        raise
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
            aiohttp.ClientOSError, ConnectionError) as e:
        where = "before the first token" if math.isnan(record.first_token_s) else \
            f"after {stream.text_tokens} token(s)"
        if not record.done:
            fail(FailureReason("connection", f"{type(e).__name__} {where}: {e}"))
    except Exception as e:  # noqa: BLE001 - every request must end with a reason
        if not record.done:
            fail(FailureReason("client", f"{type(e).__name__}: {e}"))
    finally:
        if resp is not None:
            resp.close()
