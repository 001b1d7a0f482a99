"""`tiertp replay --verdict`: each load of a finished report judged by the
acceptance checks (tiertp against the best other policy serving every tier,
no fall as load rises, the oracle a ceiling, baselines sane at the lowest
load), and a report that is not one named in the error."""

from __future__ import annotations

import json

import pytest

from tiertp.replay.report_files import find_reports
from tiertp.replay.verdict import judge, verdict_text


def entry(goodput: float, fair: bool = True, settings: str = "default") -> dict:
    return {"goodput_rps": goodput, "fair": fair, "settings_label": settings}


def report(*loads: tuple[float, dict]) -> dict:
    return {"loads": [{"rps": rps, "policies": policies} for rps, policies in loads]}


def test_tiertp_is_judged_against_the_best_other_policy_serving_every_tier():
    (v,) = judge(report((10, {"tiertp": entry(9.0), "oracle": entry(9.5), "sglang": entry(9.4, settings="tp=2"),
                              "split": entry(12.0, fair=False)})))
    # split serves more but leaves a tier unserved: not the rival
    assert (v.rival, v.rival_rps) == ("sglang (tp=2)", 9.4)
    assert v.ratio == pytest.approx(9.0 / 9.4)
    assert v.misses == [f"{9.0 / 9.4:.3f}x sglang (tp=2)"]
    (v,) = judge(report((10, {"tiertp": entry(9.2), "oracle": entry(9.5), "sglang": entry(9.4)})))
    assert v.misses == []  # 0.979x: within the 0.97 bar


def test_an_unfair_tiertp_misses_unless_no_other_policy_serves_every_tier():
    (v,) = judge(report((10, {"tiertp": entry(9.0, fair=False), "sglang": entry(5.0)})))
    assert v.misses == ["tiertp leaves a tier unserved"]
    (v,) = judge(report((10, {"tiertp": entry(9.0, fair=False), "sglang": entry(8.0, fair=False)})))
    assert (v.rival, v.misses) == (None, [])


def test_a_fall_under_load_an_oracle_below_a_policy_and_a_broken_baseline_are_misses():
    low, mid, high = judge(report(
        (5, {"tiertp": entry(5.0), "oracle": entry(5.0), "sglang": entry(5.0), "split": entry(3.0)}),
        (20, {"tiertp": entry(15.0), "oracle": entry(14.0), "sglang": entry(12.0)}),
        (10, {"tiertp": entry(10.0), "oracle": entry(10.0), "split": entry(1.0)})))
    assert [v.rps for v in (low, mid, high)] == [5, 10, 20]  # load order, whatever the report's
    assert (low.misses, low.other_misses) == ([], ["baselines under 0.8x the best: split"])
    assert mid.other_misses == []  # a weak baseline above the lowest load is only beaten
    assert (high.misses, high.other_misses) == ([], ["above the oracle: tiertp"])
    (_, fallen) = judge(report((5, {"tiertp": entry(10.0)}), (10, {"tiertp": entry(9.0)})))
    assert fallen.misses == ["falls to 0.900x its best at a lower load"]


def test_the_text_lists_every_load_and_the_misses(tmp_path):
    cell = tmp_path / "grid" / "cell-a"
    cell.mkdir(parents=True)
    (cell / "report.json").write_text(json.dumps(report(
        (5, {"tiertp": entry(5.0), "oracle": entry(5.0), "sglang": entry(5.2)}),
        (10, {"tiertp": entry(9.0, fair=False), "oracle": entry(9.0), "sglang": entry(8.0)}))))
    text = verdict_text([tmp_path / "grid"])
    assert "cell-a   5      5.00    sglang 5.20" in text and "0.962  5.00" in text  # ratio, then the oracle
    assert "9.00*" in text
    assert "2 loads; tiertp's goodput summed over them: 14.00 req/s\ntiertp misses a check at 2 loads" in text
    assert "cell-a @5: 0.962x sglang" in text and "cell-a @10: tiertp leaves a tier unserved" in text
    assert "the oracle or a baseline misses a check at 1 load (" in text and "cell-a @5: above the oracle: sglang" in text


def test_a_missing_or_broken_report_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no report.json under"):
        find_reports([tmp_path])
    with pytest.raises(FileNotFoundError, match="absent: no such report or folder"):
        find_reports([tmp_path / "absent"])
    bad = tmp_path / "report.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="report.json: not valid JSON"):
        verdict_text([bad])
    bad.write_text("[]")
    with pytest.raises(ValueError, match="report.json: a replay report holds a JSON object, this holds list"):
        verdict_text([bad])
    bad.write_text("{}")
    with pytest.raises(ValueError, match="report.json: not a replay report \\(no 'loads' list\\)"):
        verdict_text([bad])
