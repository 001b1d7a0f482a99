"""The fairness rule (tiertp.replay.metrics.fair): every tier with >= 10% of
the requests gets >= 0.25x its proportional share of the goodput."""

from __future__ import annotations

import pytest

from tiertp.replay.metrics import fair


@pytest.mark.parametrize(("requests", "goodput", "expected"), [
    ([50, 50], [5.0, 5.0], True),        # exactly proportional
    ([50, 50], [8.75, 1.25], True),      # agent: 1.25 = 0.25 x (0.5 x 10), at the bound
    ([50, 50], [8.8, 1.2], False),       # just below it
    ([50, 50], [10.0, 0.0], False),      # a starved tier
    ([95, 5], [10.0, 0.0], True),        # 5% of the requests: exempt
    ([90, 10], [10.0, 0.0], False),      # 10%: judged
    ([90, 10], [9.75, 0.25], True),      # 0.25 = 0.25 x (0.1 x 10)
    ([60, 40], [0.0, 0.0], True),        # no goodput at all: nothing to share
    ([0, 0], [0.0, 0.0], True),          # no requests
    ([100, 0], [10.0, 0.0], True),       # a tier without requests
    ([40, 40, 20], [6.0, 3.0, 0.4], False),  # third tier: 0.4 < 0.25 x (0.2 x 9.4)
    ([40, 40, 20], [6.0, 3.0, 0.5], True),
])
def test_fairness_rule(requests, goodput, expected):
    assert fair(requests, goodput) is expected


def test_lists_must_match():
    with pytest.raises(ValueError):
        fair([1, 2], [1.0])
