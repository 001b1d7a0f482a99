"""schemathesis hooks of tests/test_gateway_schemathesis.py (loaded through
SCHEMATHESIS_HOOKS by the `st` it runs).

`filter_case`: /openapi.json states two request rules in words that JSON
Schema cannot express: the prompt must come to at least one token, and its
tokens plus `max_tokens` must fit in the model's context. A case generated as
valid that breaks one is dropped, so that positive_data_acceptance checks what
the schema does state. The mock gateway's tokenizer makes one token of each run
of word or of punctuation characters, never one of whitespace, so a prompt of
non-whitespace has a token and a text has at most as many tokens as characters.

`after_call`: records every call (operation, status) to TIERTP_FUZZ_CALLS, for
the test's counts.
"""

from __future__ import annotations

import json
import os

import schemathesis

MAX_MODEL_LEN = int(os.environ["TIERTP_FUZZ_MAX_MODEL_LEN"])
CALLS = os.environ["TIERTP_FUZZ_CALLS"]


def _chat_prompt(messages: list[dict]) -> str:
    """The prompt the gateway renders (ChatML: the tiny tokenizer has no template)."""
    parts = []
    for m in messages:
        content = m["content"]
        text = content if isinstance(content, str) else "".join(p["text"] for p in content)
        parts.append(f"<|im_start|>{m['role']}\n{text}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def _prompt(body: dict) -> tuple[int, bool]:
    """At most how many tokens the prompt has, and whether it has one."""
    if "messages" in body:
        return len(_chat_prompt(body["messages"])), True
    prompt = body["prompt"]
    if isinstance(prompt, list) and not isinstance(prompt[0], str):
        return len(prompt), True  # token ids
    text = prompt[0] if isinstance(prompt, list) else prompt
    # str.isspace is true of every character the tokenizer takes for whitespace.
    return len(text), not text.isspace() and text != ""


@schemathesis.hook
def filter_case(context, case) -> bool:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return True
    body = case.body
    asked = body.get("max_completion_tokens") if "messages" in body else None
    if asked is None:
        asked = body.get("max_tokens")
    tokens, has_one = _prompt(body)
    # Without `max_tokens` the gateway cuts its default to what fits, so the
    # prompt alone must leave room for one token.
    return has_one and tokens + (asked or 1) <= MAX_MODEL_LEN


@schemathesis.hook
def after_call(context, case, response) -> None:
    with open(CALLS, "a") as f:
        f.write(json.dumps([case.operation.label, response.status_code]) + "\n")
