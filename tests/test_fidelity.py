"""`tiertp fidelity` end to end against the fake OpenAI server of
test_replay_live_client (no SGLang): the simulator runs on a given profile,
the live side on the fake server, and fidelity.json compares them. Also the
pure parts: relative errors, the simulator's profile."""

from __future__ import annotations

import json

import pytest
from test_replay_live_client import FakeServer, tiers_file, tokenizer_dir  # noqa: F401 - fixture

from tiertp.fidelity.compare import FIGURES, compare, rel_err, table
from tiertp.fidelity.sim_profile import sim_profile_doc
from tiertp.replay.live.caps import LengthCaps
from tiertp.replay.live.limits import Limits
from tiertp.replay.workload import TierRule


def profile_doc(extra_tp: bool = False) -> dict:
    level = {
        "prefill": {"batch_tokens": [16, 1024], "batch_size": [1, 8], "latency_ms": [[5, 6], [50, 55]]},
        "decode": {"batch_size": [1, 16], "context_len": [64, 1024], "latency_ms": [[2, 3], [4, 6]]},
    }
    doc = {"format": "tiertp-profile", "version": 1, "gpu": "cpu", "model": "fake", "dtype": "float32",
           "tp_levels": {"1": level}}
    if extra_tp:
        doc["tp_levels"]["2"] = json.loads(json.dumps(level))
    return doc


def test_rel_err():
    assert rel_err(1.1, 1.0) == pytest.approx(0.1)
    assert rel_err(None, 1.0) is None and rel_err(1.0, 0.0) is None and rel_err(1.0, None) is None


def test_sim_profile_keeps_live_tp_levels_and_sets_kv_and_overhead():
    doc = sim_profile_doc(profile_doc(extra_tp=True), 4096, [1], iteration_overhead_ms=10)
    assert list(doc["tp_levels"]) == ["1"]
    level = doc["tp_levels"]["1"]
    assert level["kv_capacity_tokens"] == 4096
    assert level["decode"]["latency_ms"] == [[12, 13], [14, 16]]
    assert doc["provenance"]["fidelity"]["iteration_overhead_ms"] == 10
    with pytest.raises(ValueError, match="missing"):
        sim_profile_doc(profile_doc(), 4096, [1, 2])


def test_fidelity_compares_simulated_and_live_runs(tmp_path, tokenizer_dir):  # noqa: F811
    from tiertp.fidelity.driver import FidelityConfig, run_fidelity

    server = FakeServer(lambda n, b: "http429" if n % 9 == 4 else "ok")
    try:
        profile = tmp_path / "profile.json"
        profile.write_text(json.dumps(profile_doc()))
        cfg = FidelityConfig(
            traces=["synthetic:poisson,rate=20,prompt=50,output=6,duration=5,seed=1"], rps=[4.0, 8.0],
            duration_s=2.0, out=tmp_path / "fid", tiers_path=tiers_file(tmp_path),
            tier_rule=TierRule(fractions={"chat": 0.5, "agent": 0.5}), caps=LengthCaps(40, 4),
            limits=Limits(first_token_s=3, stall_s=3, total_s=10), profile=profile, url=server.url,
            tokenizer=str(tokenizer_dir), sim_policies=["tiertp", "sglang"], cooldown_s=0, progress=False,
            command_line=["tiertp", "fidelity", "..."])
        report = run_fidelity(cfg)
    finally:
        server.stop()
    doc = json.loads((cfg.out / "fidelity.json").read_text())
    assert doc["simulator"]["gpus"] == 2 and doc["simulator"]["tp_levels"] == [1]
    assert doc["simulator"]["kv_capacity_tokens_per_device"] > 0
    assert doc["length_caps"] == {"max_prompt_tokens": 40, "max_output_tokens": 4}
    probe = doc["unloaded_probe"]["tiers"]
    assert set(probe) == {"chat", "agent"}
    assert probe["chat"]["measured"]["ttft_ms"] > 0 and probe["chat"]["predicted"]["ttft_ms"] > 0
    assert [round(x["offered_rps"]) for x in doc["loads"]] == [4, 8]
    for load in doc["loads"]:
        assert load["live"]["completed"] + load["live"]["failed"] == load["requests"]
        assert load["live"]["failed"] >= 1
        rows = load["comparison"]["tiertp"]
        assert [r["tier"] for r in rows] == ["all", "chat", "agent"]
        assert set(FIGURES) <= set(rows[0])
        assert rows[0]["goodput_rps"]["measured"] is not None and rows[0]["goodput_rps"]["predicted"] is not None
    sim_profile = json.loads((cfg.out / "profile-sim.json").read_text())
    assert sim_profile["tp_levels"]["1"]["kv_capacity_tokens"] > 0
    rep = json.loads((cfg.out / "report.json").read_text())
    assert set(rep["loads"][0]["policies"]) == {"tiertp", "sglang", "tiertp-calibrated", "live"}
    # the calibrated prediction scales every profile cell by the probe's measured/predicted TPOT
    assert doc["calibration"]["scale"] > 0
    calibrated = json.loads((cfg.out / "profile-sim-calibrated.json").read_text())
    assert calibrated["provenance"]["fidelity"]["scale"] == pytest.approx(doc["calibration"]["scale"])
    assert "simulated tiertp vs measured" in report.text
    assert (cfg.out / "goodput.png").stat().st_size > 0


def test_table_shows_predicted_measured_and_error():
    from tiertp.replay.metrics import RunMetrics, TierMetrics

    def metrics(goodput, ttft):
        pct = {"p50": ttft, "p90": ttft, "p99": ttft}
        t = TierMetrics("chat", 10, 10, 0, 8, 0.8, goodput, pct, pct)
        return RunMetrics(10, 10, 0, 8, 0.8, goodput, 1.0, 10.0, [t])

    rows = compare(metrics(1.1, 200.0), metrics(1.0, 100.0))
    assert rows[1]["ttft_p50_ms"]["rel_err"] == pytest.approx(1.0)
    text = table(rows)
    assert "1.10/1.00 (+10%)" in text and "200/100 (+100%)" in text
