"""The profile as served (tiertp.fidelity.calibration): the per-request
decode cost the loaded probe implies, the calibrated profile, and a started
server restarted to plan with it."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from test_fidelity import FAKE_TRACE, fake_serve_process, profile_doc
from test_replay_live_client import FakeServer, tiers_file, tokenizer_dir  # noqa: F401 - fixture

from tiertp.fidelity.calibration import calibration_scale, fit_decode_overhead, prefill_fit, ttft_offset_ms
from tiertp.fidelity.probe import LoadedProbe, second_probe_tokens, tier_prompt_medians
from tiertp.fidelity.sim_profile import CellScale, sim_profile_doc
from tiertp.replay.live.caps import LengthCaps
from tiertp.replay.live.limits import Limits
from tiertp.replay.live.records import RequestRecord
from tiertp.replay.sim_run import SimContext, run_once
from tiertp.replay.workload import Load, TierRule
from tiertp.traces import make_trace


def test_decode_cost_per_extra_request_grows_with_the_batch_only():
    doc = sim_profile_doc(profile_doc(), 4096, [1], scale=CellScale(2.0, 2.0), decode_ms_per_extra_request=0.5)
    level = doc["tp_levels"]["1"]
    # batch 1 pays nothing extra, batch 16 fifteen times 0.5 ms; prefill only the scale
    assert level["decode"]["latency_ms"] == [[4, 6], [8 + 7.5, 12 + 7.5]]
    assert level["prefill"]["latency_ms"] == [[10, 12], [100, 110]]
    assert doc["provenance"]["fidelity"]["decode_ms_per_extra_request"] == 0.5
    with pytest.raises(ValueError, match="per extra request"):
        sim_profile_doc(profile_doc(), 4096, [1], decode_ms_per_extra_request=-1)


def test_prefill_and_decode_cells_take_their_own_scale():
    level = sim_profile_doc(profile_doc(), 4096, [1], scale=CellScale(prefill=1.5, decode=0.5))["tp_levels"]["1"]
    assert level["prefill"]["latency_ms"] == [[7.5, 9], [75, 82.5]]
    assert level["decode"]["latency_ms"] == [[1, 1.5], [2, 3]]
    with pytest.raises(ValueError, match="prefill scale"):
        CellScale(prefill=0)


def _ratios(ttft: float | None, tpot: float | None) -> dict:
    """A probe tier's figures at one prompt length (predicted 100 ms each) with these measured ratios."""
    return {"predicted": {"ttft_ms": 100.0, "tpot_ms": 100.0},
            "measured": {"ttft_ms": ttft and 100 * ttft, "tpot_ms": tpot and 100 * tpot},
            "ratio": {"ttft_ms": ttft, "tpot_ms": tpot}}


def test_scale_is_the_probes_ttft_ratio_for_prefill_and_tpot_ratio_for_decode():
    tiers = {
        "chat": _ratios(1.05, 0.83),
        "agent": _ratios(0.99, 0.92),
        "batch": _ratios(1.01, None),
    }
    scale = calibration_scale({"tiers": tiers})
    assert scale.prefill == 1.01 and scale.decode == pytest.approx(0.875)
    no_ttft = {"chat": _ratios(None, 0.8)}
    assert calibration_scale({"tiers": no_ttft}) == CellScale(prefill=0.8, decode=0.8)
    assert calibration_scale({"tiers": {"chat": _ratios(1.0, None)}}) is None


def _figures(predicted_ttft: float, measured_ttft: float, tpot_ratio: float = 1.0) -> dict:
    return {"predicted": {"ttft_ms": predicted_ttft, "tpot_ms": 10.0},
            "measured": {"ttft_ms": measured_ttft, "tpot_ms": 10.0 * tpot_ratio},
            "ratio": {"ttft_ms": measured_ttft / predicted_ttft, "tpot_ms": tpot_ratio}}


def test_two_prompt_lengths_split_the_ttft_excess_into_a_factor_and_a_fixed_latency():
    # served: 1.1 x the profile's prefill plus 60 ms on the way to the first token
    unloaded = {"tiers": {"chat": _figures(150, 1.1 * 150 + 60), "agent": _figures(150, 1.1 * 150 + 60, 1.2)},
                "second_length": {"prompt_tokens": 40,
                                  "tiers": {"chat": _figures(60, 1.1 * 60 + 60), "agent": _figures(60, 1.1 * 60 + 60)}}}
    factor, offset = prefill_fit(unloaded)
    assert factor == pytest.approx(1.1) and offset == pytest.approx(60)
    scale = calibration_scale(unloaded)
    # decode: the median TPOT ratio over both lengths; prefill: the fit's factor, not the median
    # prompt's TTFT ratio (1.5)
    assert (scale.prefill, scale.decode) == (pytest.approx(1.1), pytest.approx(1.0))
    assert ttft_offset_ms(unloaded) == pytest.approx(60)


def test_an_excess_that_shrinks_below_zero_is_a_factor_alone():
    unloaded = {"tiers": {"chat": _figures(500, 650)}, "second_length": {"prompt_tokens": 100,
                                                                         "tiers": {"chat": _figures(100, 100)}}}
    factor, offset = prefill_fit(unloaded)  # the unconstrained line would cross below zero at 0
    assert offset == 0 and factor == pytest.approx((100 * 100 + 500 * 650) / (100 ** 2 + 500 ** 2))
    assert ttft_offset_ms(unloaded) == 0


def test_one_prompt_length_keeps_the_ttft_ratio_and_no_offset():
    unloaded = {"tiers": {"chat": _figures(150, 210), "agent": _figures(150, 180)}}
    assert prefill_fit(unloaded) is None and ttft_offset_ms(unloaded) == 0
    assert calibration_scale(unloaded).prefill == pytest.approx(1.3)


def test_the_second_probe_length_is_a_quarter_of_the_first():
    assert second_probe_tokens(174) == 43
    assert second_probe_tokens(4) == 1 and second_probe_tokens(3) is None


def test_each_tier_is_probed_at_its_own_median_prompt():
    # chat's short prompts dominate the load's median (150); agent's own median is 950, and a
    # tier with no request takes the load's
    trace = make_trace("t", [0, 1, 2, 3, 4], [140, 150, 160, 900, 950], [8] * 5, tier=[0, 0, 0, 1, 1],
                       tier_names=["chat", "agent", "batch"])
    assert tier_prompt_medians(trace) == {"chat": 150, "agent": 925, "batch": 160}


def test_a_ttft_offset_delays_every_first_token_and_the_slo_sees_it(tmp_path):
    ctx = _ctx(tmp_path)
    trace = make_trace("one", [0.0], [40], [20], tier=[0], tier_names=["chat", "agent"])
    plain = run_once(ctx, Load(None, trace, 1.0), "tiertp", {})
    ttft_slo = ctx.slos[0].ttft_ms
    late = run_once(replace(ctx, ttft_offset_ms=ttft_slo), Load(None, trace, 1.0), "tiertp", {})
    assert late.ttft_ms[0] == pytest.approx(plain.ttft_ms[0] + ttft_slo)
    assert late.tpot_ms[0] == plain.tpot_ms[0]
    assert plain.metrics.met == 1 and late.metrics.met == 0


def _ctx(tmp_path, extra_ms: float | None = None) -> SimContext:
    from tiertp import _scheduler

    doc = sim_profile_doc(profile_doc(), 100_000, [1])
    profile = _scheduler.Profile.from_json(json.dumps(doc))
    tiers = _scheduler.TierSet.load(str(tiers_file(tmp_path)))
    ctx = SimContext(_scheduler.simulate, profile, tiers, 2, gpus_per_node=2)
    if extra_ms is None:
        return ctx
    engine = sim_profile_doc(profile_doc(), 100_000, [1], decode_ms_per_extra_request=extra_ms)
    return replace(ctx, engine_profile=_scheduler.Profile.from_json(json.dumps(engine)))


def test_the_fit_recovers_the_per_request_cost_of_a_simulated_server(tmp_path):
    """Waves measured on a 'server' whose decode steps cost 0.8 ms per extra
    request, planned on the plain profile: the fit finds 0.8 ms."""
    sizes = [c for c in (2, 4, 8, 16) for _ in range(2)]
    sent = np.repeat(np.arange(len(sizes)) * 5.0, sizes).tolist()  # a wave every 5 s
    concurrency = np.repeat(sizes, sizes).tolist()
    tiers = [("chat", "agent")[i % 2] for i in range(len(sent))]
    tier_ids = [("chat", "agent").index(t) for t in tiers]
    trace = make_trace("waves", sent, [40] * len(sent), [20] * len(sent), tier=tier_ids, tier_names=["chat", "agent"])
    truth = run_once(_ctx(tmp_path, 0.8), Load(None, trace, 1.0), "tiertp", {})
    records = []
    for i, (t, tier, tpot) in enumerate(zip(sent, tiers, truth.tpot_ms)):
        r = RequestRecord(i, tier, 40, 20, t, sent_s=t)
        if math.isfinite(tpot):
            r.first_token_s = t + 0.01
            r.complete(r.first_token_s + tpot * 19 / 1e3, 20, "length")
        records.append(r)
    probe = LoadedProbe(40, 20, records, concurrency)
    fit = fit_decode_overhead(probe, ["chat", "agent"], lambda c: _ctx(tmp_path, c), "tiertp", largest_ms=2.0)
    assert fit.decode_ms_per_extra_request == pytest.approx(0.8)
    assert not fit.at_bound
    waves = {w["concurrency"]: w for w in fit.waves}
    assert set(waves) == {2, 4, 8, 16}
    assert waves[16]["calibrated_tpot_ms"] == pytest.approx(waves[16]["measured_tpot_ms"])
    assert waves[16]["scaled_tpot_ms"] < waves[16]["measured_tpot_ms"]


def test_no_completed_wave_fits_nothing(tmp_path):
    records = [RequestRecord(0, "chat", 40, 20, 0.0, sent_s=0.0)]
    probe = LoadedProbe(40, 20, records, [2])
    assert fit_decode_overhead(probe, ["chat", "agent"], lambda c: _ctx(tmp_path, c), "tiertp", 2.0) is None


def test_a_started_server_is_restarted_to_plan_with_the_calibrated_profile(monkeypatch, tmp_path,
                                                                           tokenizer_dir):  # noqa: F811
    from tiertp.fidelity import experiment

    server = FakeServer(lambda n, b: "ok")
    started = []
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_doc()))
    monkeypatch.setattr(experiment, "ServeProcess", fake_serve_process(server, tmp_path, started))
    try:
        cfg = experiment.FidelityConfig(
            traces=[FAKE_TRACE], rps=[4.0], duration_s=2.0, out=tmp_path / "fid", tiers_path=tiers_file(tmp_path),
            tier_rule=TierRule(fractions={"chat": 0.5, "agent": 0.5}), caps=LengthCaps(40, 4),
            limits=Limits(first_token_s=3, stall_s=3, total_s=10), profile=profile, tokenizer=str(tokenizer_dir),
            probe_concurrency=(2, 4), cooldown_s=0, progress=False, plots=False)
        report = experiment.run_fidelity(cfg)
    finally:
        server.stop()
    profiles = [kw["profile"] for _, kw in started]
    assert profiles == [cfg.out / "profile-sim.json", cfg.out / "profile-sim-calibrated.json"]
    doc = json.loads((cfg.out / "fidelity.json").read_text())
    assert [w["concurrency"] for w in doc["loaded_probe"]["waves"]] == [2, 4]
    assert doc["loaded_probe"]["waves"][0]["requests"] == 4  # each size twice
    cal = doc["calibration"]
    assert cal["server_plans_with"] == "calibrated profile (restarted)"
    assert cal["decode_ms_per_extra_request"] >= 0 and min(cal["scale"].values()) > 0
    written = json.loads((cfg.out / "profile-sim-calibrated.json").read_text())["provenance"]["fidelity"]
    assert written["decode_ms_per_extra_request"] == cal["decode_ms_per_extra_request"]
    assert "restarted to plan with the calibrated profile" in report.text


def test_probe_concurrency_option(monkeypatch, tmp_path, capsys):
    from test_fidelity import _fidelity_cli

    code, cfg = _fidelity_cli(monkeypatch, tmp_path, "--probe-concurrency", "8,2")
    assert code == 0 and cfg.probe_concurrency == (2, 8)
    code, cfg = _fidelity_cli(monkeypatch, tmp_path, "--probe-concurrency", "0")
    assert code == 0 and cfg.probe_concurrency == ()
    with pytest.raises(SystemExit) as usage:
        _fidelity_cli(monkeypatch, tmp_path, "--probe-concurrency", "2,-1")
    assert usage.value.code == 2 and "--probe-concurrency" in capsys.readouterr().err


def test_the_unloaded_probe_is_simulated_as_sent(tmp_path):
    """The probe's requests are replayed at their send times, in one run: a
    request sent while another still runs is predicted behind it, and each
    prediction lands on its own record, whatever order they were sent in."""
    from tiertp.fidelity.probe import _simulate_as_sent

    ctx = _ctx(tmp_path)
    names = ["chat", "agent"]
    # records 0 and 1 far apart; record 3 sent just after record 2, record 2 listed last
    sent = {0: 0.0, 1: 30.0, 2: 60.0, 3: 60.001}
    records = [RequestRecord(i, "chat", 40, 20, s, sent_s=s) for i, s in sent.items()]
    records = records[:2] + [records[3], records[2]]
    predicted = _simulate_as_sent(ctx, "tiertp", names, records)
    alone, later, crowded, first = predicted["ttft_ms"]
    assert alone == pytest.approx(later)  # the same request, alone each time
    assert first == pytest.approx(alone)
    assert crowded > first  # sent while record 2 was running
