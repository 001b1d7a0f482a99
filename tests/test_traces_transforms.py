"""Rate scaling, time windows, tier assignment and merging."""

from __future__ import annotations

import numpy as np
import pytest

from tiertp.traces import (
    TraceError, assign_by_fractions, assign_by_map, make_trace, merge, parse_fractions, parse_pairs,
    rename_tiers, scale_to_rps, scale_window_to_rps, time_window,
)


def trace(source, arrivals, epoch=None, tier=None, names=()):
    n = len(arrivals)
    return make_trace(source, arrivals, np.arange(1, n + 1) * 10, np.full(n, 5), tier, names, start_epoch_s=epoch)


def test_scale_to_target_rate_keeps_shape():
    t = trace("x", [0.0, 1.0, 3.0, 7.0])
    s = scale_to_rps(t, 3.0)
    assert s.mean_rps == pytest.approx(3.0)
    np.testing.assert_allclose(s.arrival_s, [0.0, 1 / 7, 3 / 7, 1.0])
    np.testing.assert_array_equal(s.prompt_tokens, t.prompt_tokens)
    with pytest.raises(TraceError, match="target rate"):
        scale_to_rps(t, 0)
    with pytest.raises(TraceError, match="rate is undefined"):
        scale_to_rps(trace("one", [0.0]), 1.0)


def test_time_window():
    t = trace("x", [0.0, 1.0, 2.5, 4.0, 6.0])
    w = time_window(t, 3.0)
    assert w.arrival_s.tolist() == [0.0, 1.0, 2.5]
    w2 = time_window(t, 3.0, start_s=2.0)
    assert w2.arrival_s.tolist() == [0.5, 2.0] and w2.prompt_tokens.tolist() == [30, 40]


def test_assign_by_map_and_rename():
    t = assign_by_map(trace("azure-code", [0.0, 1.0]), {"azure-code": "agent", "azure-conv": "chat"})
    assert t.tier_of() == ["agent", "agent"]
    r = rename_tiers(t, ["chat", "agent"])
    assert r.tier.tolist() == [1, 1] and r.tier_names == ("chat", "agent")
    with pytest.raises(TraceError, match=r"tier map has no entry for trace 'other'; it maps \['azure-code'\]"):
        assign_by_map(trace("other", [0.0]), {"azure-code": "agent"})
    with pytest.raises(TraceError, match=r"tier\(s\) \['agent'\] not in the tier config; valid tiers: \['chat'\]"):
        rename_tiers(t, ["chat"])


def test_assign_by_fractions_is_seeded_and_proportional():
    t = trace("x", np.arange(20_000) / 100.0)
    a = assign_by_fractions(t, {"chat": 0.7, "agent": 0.3}, seed=5)
    b = assign_by_fractions(t, {"chat": 0.7, "agent": 0.3}, seed=5)
    np.testing.assert_array_equal(a.tier, b.tier)
    assert (a.tier == 0).mean() == pytest.approx(0.7, abs=0.02)
    assert parse_fractions("chat=0.7,agent=0.3") == {"chat": 0.7, "agent": 0.3}
    with pytest.raises(TraceError, match="sum to 0.9"):
        parse_fractions("chat=0.6,agent=0.3")
    with pytest.raises(TraceError, match="expected NAME=VALUE"):
        parse_pairs("chat", "tier map")


def test_merge_on_common_clock_and_separately():
    a = assign_by_map(trace("a", [0.0, 2.0], epoch=100.0), {"a": "chat"})
    b = assign_by_map(trace("b", [0.0, 0.5], epoch=101.0), {"b": "agent"})
    m = merge([a, b])
    assert m.arrival_s.tolist() == [0.0, 1.0, 1.5, 2.0]
    assert m.tier_of() == ["chat", "agent", "agent", "chat"]
    assert m.start_epoch_s == 100.0 and m.source == "a+b"
    separate = merge([a, trace("c", [0.0, 0.5])])
    assert separate.arrival_s.tolist() == [0.0, 0.0, 0.5, 2.0]
    assert separate.tier.tolist() == [0, -1, -1, 0]
    with pytest.raises(TraceError, match="nothing to merge"):
        merge([])


def test_trace_contract_is_checked():
    with pytest.raises(TraceError, match="`output_tokens` < 1"):
        make_trace("x", [0.0], [1], [0])
    with pytest.raises(TraceError, match="tier index 3"):
        make_trace("x", [0.0], [1], [1], [3], ["chat"])


def test_scale_window_to_rps_fills_the_window():
    t = trace("x", np.concatenate([np.linspace(0, 50, 40), np.linspace(51, 100, 200)]))
    s = time_window(scale_window_to_rps(t, 4.0, 10.0), 10.0)
    assert len(s) == 40 and s.arrival_s[-1] < 10.0
    whole = scale_window_to_rps(t, 4.0, 1000.0)  # fewer requests than 4 x 1000: the whole trace at 4 req/s
    assert whole.mean_rps == pytest.approx(4.0)
