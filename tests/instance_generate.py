"""`generate`: run requests on an instance until each has its tokens (the tests' driver).

The simplest caller of the instance API: admit everything at once, iterate,
release each request when it has `max_new_tokens` tokens or stopped.
"""

from __future__ import annotations

from tiertp.execution.instance import TpInstance
from tiertp.execution.records import NewRequest, RequestId


def generate(instance: TpInstance, requests: list[NewRequest], max_new_tokens: int,
             stop_on_eos: bool = False) -> dict[RequestId, list[int]]:
    """Output token ids per request id (all requests released at the end)."""
    return continue_generation(instance, {r.rid: [] for r in requests}, max_new_tokens, admit=requests,
                               stop_on_eos=stop_on_eos)


def continue_generation(instance: TpInstance, outputs: dict[RequestId, list[int]], max_new_tokens: int,
                        admit: list[NewRequest] = (), stop_on_eos: bool = False) -> dict[RequestId, list[int]]:
    """Iterate until every request of `outputs` (already held, or in `admit`)
    has max_new_tokens outputs, appending to `outputs`; releases them all."""
    outputs = {rid: list(toks) for rid, toks in outputs.items()}
    live = {rid for rid, toks in outputs.items() if len(toks) < max_new_tokens}
    release = [rid for rid in outputs if rid not in live]  # already complete
    admit = list(admit)
    while live:
        finished = []
        for t in instance.iterate(admit, release):
            outputs[t.rid].append(t.token)
            if len(outputs[t.rid]) >= max_new_tokens or (stop_on_eos and t.stopped):
                live.discard(t.rid)
                finished.append(t.rid)
        admit, release = [], finished
    if release:
        instance.release(release)
    return outputs
