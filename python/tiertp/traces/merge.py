"""Merging several traces into one, sorted by arrival."""

from __future__ import annotations

import numpy as np

from tiertp.traces.errors import TraceError
from tiertp.traces.trace import Trace, make_trace


def merge(traces: list[Trace], source: str | None = None) -> Trace:
    """One trace with every request of `traces`, stably sorted by arrival.

    Clock: when every input has `start_epoch_s` (one recording, e.g. the
    Azure conv and code files), arrivals are placed on that common wall clock
    and rebased to the earliest; otherwise each input starts at its own 0.
    Tier names are unioned in first-seen order; `skipped` counts add up.
    """
    if not traces:
        raise TraceError("nothing to merge: no traces")
    epochs = [t.start_epoch_s for t in traces]
    common = all(e is not None for e in epochs)
    origin = min(epochs) if common else 0.0
    names: list[str] = []
    arrival, prompt, output, tier = [], [], [], []
    skipped: dict[str, int] = {}
    for t in traces:
        for n in t.tier_names:
            if n not in names:
                names.append(n)
        lookup = np.array([names.index(n) for n in t.tier_names] + [-1], dtype=np.int64)
        offset = (t.start_epoch_s - origin) if common else 0.0
        arrival.append(t.arrival_s + offset)
        prompt.append(t.prompt_tokens)
        output.append(t.output_tokens)
        tier.append(lookup[t.tier])
        for reason, count in t.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
    return make_trace(
        source or "+".join(t.source for t in traces),
        np.concatenate(arrival), np.concatenate(prompt), np.concatenate(output), np.concatenate(tier),
        names, start_epoch_s=origin if common else None, skipped=skipped,
    )
