"""The scheduler core from Python: profiles, tiers, planner, dispatcher and
batch policy, with typed errors on bad input."""

from __future__ import annotations

import json

import pytest

from tiertp import _scheduler as s
from tier_files import tier_text

TIERS = tier_text("bindings")


@pytest.fixture()
def tiers():
    return s.TierSet.from_toml(TIERS, "tiers.toml")


@pytest.fixture()
def profile():
    return s.Profile.synthetic()


def stats(chat=10.0, batch=2.0):
    return {"chat": s.TierStats(chat, 800.0, 200.0), "batch": s.TierStats(batch, 1500.0, 300.0)}


def test_profile_roundtrip_and_queries(profile, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(profile.to_json())
    loaded = s.Profile.load(str(path))
    assert loaded.tp_levels == [1, 2, 4, 8]
    assert loaded.prefill_ms(2, 2048, 1) < loaded.prefill_ms(1, 2048, 1)
    assert loaded.decode_ms(1, 64, 2048) > loaded.decode_ms(1, 1, 2048)
    assert loaded.kv_capacity_tokens(1) > 0
    with pytest.raises(s.ProfileError, match="no TP level 3"):
        loaded.decode_ms(3, 1, 100)


def test_profile_clamps_with_a_warning(profile, caplog):
    with caplog.at_level("WARNING"):
        far = profile.decode_ms(1, 100_000, 2048)
    assert far == profile.decode_ms(1, 512, 2048)
    assert profile.clamped_queries() >= 1
    assert any("outside the profiled range" in r.getMessage() for r in caplog.records)


def test_profile_clamps_below_an_axis_quietly(profile, caplog):
    """Below an axis the edge's value bounds the query from above (less work):
    clamped, counted, but no warning (the planner probes one-token prompts)."""
    before = profile.clamped_queries()
    with caplog.at_level("WARNING"):
        near = profile.decode_ms(1, 1, 1)
    low_edge = json.loads(profile.to_json())["tp_levels"]["1"]["decode"]["context_len"][0]
    assert low_edge > 1
    assert near == profile.decode_ms(1, 1, low_edge)
    assert profile.clamped_queries() == before + 1
    assert not [r for r in caplog.records if "outside the profiled range" in r.getMessage()]


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.update(version=7), "field `version` = 7"),
        (lambda d: d["tp_levels"]["1"]["decode"]["latency_ms"][2].__setitem__(1, -1.0), "tp_levels.1.decode.latency_ms[2][1]"),
        (lambda d: d["tp_levels"]["2"]["prefill"]["batch_size"].reverse(), "strictly increasing"),
        (lambda d: d["tp_levels"].update({"16": d["tp_levels"]["1"]}), "tp_levels.16"),
        (lambda d: d.update(extra=1), "unknown field `extra`"),
    ],
)
def test_corrupt_profiles_name_the_problem(profile, tmp_path, mutate, expected):
    doc = json.loads(profile.to_json())
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(s.ProfileError) as e:
        s.Profile.load(str(path))
    assert str(path) in str(e.value) and expected in str(e.value)


def test_truncated_and_missing_profiles(profile, tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(profile.to_json()[:500])
    with pytest.raises(s.ProfileError, match="EOF"):
        s.Profile.load(str(path))
    with pytest.raises(s.ProfileError, match="cannot read"):
        s.Profile.load(str(tmp_path / "missing.json"))


def test_tier_config_errors():
    with pytest.raises(s.TierConfigError, match="unknown field"):
        s.TierSet.from_toml('[[tier]]\nname="a"\nttft_ms=1\ntpot_ms=1\ncolor="red"\n')
    with pytest.raises(s.TierConfigError, match="`tpot_ms` = 0"):
        s.TierSet.from_toml('[[tier]]\nname="a"\nttft_ms=1\ntpot_ms=0\n')
    t = s.TierSet.from_toml(TIERS)
    assert t.names == ["chat", "batch"] and len(t) == 2
    assert t.to_list()[1]["background"] is True
    with pytest.raises(s.TierConfigError, match="valid tiers"):
        t.id_of("gold")


def test_planner_step_propose_estimate(profile, tiers):
    planner = s.Planner(profile, tiers, gpus=8)
    out = planner.step(stats())
    plan = out["plan"]
    assert out["changed"] and len(out["commands"]) == 8
    assert sum(g["tp"] for g in plan.groups()) == 8
    assert plan.tier_capacity_rps["chat"] >= 10.0
    assert planner.current().to_dict() == plan.to_dict()
    again = planner.step(stats(chat=10.2))
    assert not again["changed"] and again["commands"] == []
    est = planner.estimate(stats())
    assert [e["tier"] for e in est] == ["chat", "batch"]
    assert {t["tp"] for t in est[0]["per_tp"]} == {1, 2, 4, 8}
    assert all(c["goodput_efficiency"] > 0 for c in est[0]["candidates"])
    proposal = planner.propose(stats(chat=40.0))
    assert proposal.num_gpus == 8
    assert json.loads(proposal.to_json())["num_gpus"] == 8


def test_planner_input_errors(profile, tiers):
    with pytest.raises(s.PlanError, match="give the cluster size"):
        s.Planner(profile, tiers)
    with pytest.raises(s.PlanError, match="has 9 GPUs"):
        s.Planner(profile, tiers, nodes=[9])
    for per_node in (0, 9):
        with pytest.raises(s.PlanError, match=f"gpus_per_node = {per_node}: a node must have 1 to 8 GPUs"):
            s.Planner(profile, tiers, gpus=8, gpus_per_node=per_node)
    with pytest.raises(s.PlanError, match="hysteresis"):
        s.Planner(profile, tiers, gpus=8, hysteresis=-1.0)
    planner = s.Planner(profile, tiers, gpus=8)
    with pytest.raises(s.PlanError, match="no stats for tier \"batch\""):
        planner.step({"chat": s.TierStats(1.0, 10.0, 10.0)})
    with pytest.raises(s.PlanError, match="unknown tier \"gold\""):
        planner.step({**stats(), "gold": s.TierStats(1.0, 10.0, 10.0)})
    with pytest.raises(s.PlanError, match="arrival_rate"):
        s.TierStats(-1.0, 10.0, 10.0)


def test_static_tp_config(profile, tiers):
    planner = s.Planner(profile, tiers, gpus=8, tp_levels=[2], allow_disaggregated=False)
    plan = planner.propose(stats())
    assert {(g["tp"], g["role"]) for g in plan.groups()} == {(2, "colocated")}


def test_dispatcher_accounts_bandwidth(profile, tiers):
    plan = s.Planner(profile, tiers, gpus=4).propose(stats())
    d = s.Dispatcher(tiers, plan)
    first, tp, cls, charge = d.dispatch(1, "chat", 500)
    assert cls == "feasible" and charge == 500 and d.load_of(first, tp)[0] == 500
    assert d.dispatch(2, "batch", 100)[2] == "background"
    assert d.in_flight == 2 and d.total_load[0] == 600
    with pytest.raises(s.DispatchError, match="already in flight"):
        d.dispatch(1, "chat", 10)
    with pytest.raises(s.DispatchError, match="valid tiers"):
        d.dispatch(3, "gold", 10)
    assert d.complete(1) == 500
    with pytest.raises(s.DispatchError, match="not in flight"):
        d.complete(1)
    d.set_plan(s.Planner(profile, tiers, gpus=4).propose(stats(chat=0.0, batch=30.0)))
    assert d.complete(2) == 100 and d.total_load == (0, 0)


def test_batch_policy(tmp_path):
    p = s.BatchPolicy(3, token_cap=1000)
    assert p.enqueue(1, "background", 10)
    assert p.enqueue(2, "feasible", 10)
    assert p.enqueue(3, "best_effort", 10)
    assert not p.enqueue(2, "feasible", 10)
    assert dict(p.queue_lengths()) == {"feasible": 1, "best_effort": 1, "background": 1}
    assert p.next_batch(1) == [2, 3]
    assert len(p) == 1 and p.remove(1) and not p.remove(1)
    with pytest.raises(s.DispatchError, match="valid classes"):
        p.enqueue(9, "urgent", 1)
    q = s.BatchPolicy(4)
    q.enqueue_with_deadline(1, "feasible", 5, 1.0)
    q.enqueue_with_deadline(2, "feasible", 5, 9.0)
    assert q.take_expired(2.0) == [1]
    assert dict(q.queue_lengths())["feasible"] == 1
    assert q.next_batch(0) == [2]
    assert s.DISPATCH_CLASSES == ["feasible", "best_effort", "background"]
    assert s.ROLES == ["prefill", "decode", "colocated"]


def test_arrival_observer(tiers):
    obs = s.ArrivalObserver(tiers, 2.0, s.TierStats(0.0, 512.0, 128.0))
    obs.record("chat", 0.5, 100, 10)
    obs.record("chat", 1.5, 300, 30)
    snap = dict(obs.snapshot(2.0))
    assert snap["chat"].arrival_rate == 1.0 and snap["chat"].mean_prompt_tokens == 200.0
    assert snap["batch"].arrival_rate == 0.0 and snap["batch"].mean_prompt_tokens == 512.0
    with pytest.raises(s.TierConfigError):
        obs.record("gold", 1.0, 1, 1)


def test_bench_scheduler_quick():
    r = json.loads(s.bench_scheduler(quick=True))
    assert set(r["plan_median_ms"]) == {"8x4", "128x4", "128x4-pooled"}
    assert r["dispatch_decisions_per_s"] > 0
