"""The ablation chain printer (tiertp.replay.ablation) on a hand-made
report.json: the steps' goodputs (sglang at TP1 from `tried`), the paper's
numbers beside them, "not run" for missing policies, the nearest load, the
ratios."""

from __future__ import annotations

import json

import pytest

from tiertp.replay.ablation import CHAIN, chain_text, nearest_load
from tiertp.replay.report_files import load_report


def entry(goodput: float, settings: dict | None = None, tried: dict | None = None) -> dict:
    settings = settings or {}
    lab = ",".join(f"{k}={v:g}" for k, v in settings.items()) or "default"
    return {"goodput_rps": goodput, "settings": settings, "settings_label": lab, "tried": tried or {lab: goodput}}


def report() -> dict:
    at_70 = {
        "sglang": entry(14.0, {"tp": 2}, {"tp=1": 11.5, "tp=2": 14.0, "tp=4": 9.0}),
        "sglang-pd": entry(0.5, {"tp": 2, "prefill_share": 0.5}),
        "split": entry(15.0),
        "tiertp-static-tp": entry(25.0, {"tp": 2}),
        "tiertp-naive-switch": entry(0.0),
        "tiertp": entry(30.0),
    }
    return {"profile": "h100_sxm/qwen2.5-14b/bfloat16", "gpus": 8, "duration_s": 600.0,
            "loads": [{"rps": 40.0, "offered_rps": 40.0, "policies": {"tiertp": entry(1.0)}},
                      {"rps": 70.0, "offered_rps": 69.9, "policies": at_70},
                      {"rps": 100.0, "offered_rps": 100.0, "policies": {"tiertp": entry(2.0)}}]}


def row(text: str, step: str) -> list[str]:
    (line,) = [x for x in text.splitlines() if x.startswith(step)]
    return line[len(step):].split()


def test_the_chain_at_70_rps():
    text = chain_text(report())
    assert text.splitlines()[0].startswith("ablation at 70 req/s (69.90 offered; h100_sxm/qwen2.5-14b/bfloat16, 8 GPUs")
    assert row(text, "SGLang, TP1") == ["sglang", "(tp=1)", "11.50", "13.2"]
    assert row(text, "+ P/D disaggregation") == ["sglang-pd", "(best:", "tp=2,prefill_share=0.5)", "0.50", "0.0"]
    assert row(text, "SGLang + SLO-aware batching, best static TP") == ["sglang-slo", "not", "run", "16.7"]
    assert row(text, "+ a partition per tier (Split)") == ["split", "15.00", "17.2"]
    assert row(text, "+ tiertp's scheduler, static TP") == ["tiertp-static-tp", "(best:", "tp=2)", "25.00", "28.0"]
    assert row(text, "+ dynamic TP, naive switching") == ["tiertp-naive-switch", "0.00", "0.0"]
    assert row(text, "+ fast switching (full tiertp)") == ["tiertp", "30.00", "33.3"]
    assert row(text, "full / static-TP scheduler") == ["1.20", "1.19"]
    assert row(text, "full / Split") == ["2.00", "1.94"]
    assert row(text, "full / SGLang (best TP)") == ["2.14", "2.5"]  # 30 / 14 (sglang's best, tp=2)
    assert [s.paper for s in CHAIN] == [13.2, 0.0, 16.7, 17.2, 28.0, 0.0, 33.3]


def test_nearest_load_and_missing_policies():
    doc = report()
    assert nearest_load(doc, 90.0)["rps"] == 100.0
    text = chain_text(doc, 90.0)
    assert "ablation at 100 req/s" in text and "90 req/s is not in the report" in text
    assert row(text, "SGLang, TP1") == ["sglang", "(tp=1)", "not", "run", "13.2"]
    assert row(text, "full / Split") == ["n/a", "1.94"]
    # a refused variant (recorded as an error) is not run either
    doc["loads"][1]["policies"]["sglang"]["tried"]["tp=1"] = "error: does not fit"
    assert row(chain_text(doc), "SGLang, TP1") == ["sglang", "(tp=1)", "not", "run", "13.2"]


def test_load_report_takes_a_folder_or_the_file(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps(report()))
    assert load_report(tmp_path) == load_report(tmp_path / "report.json") == report()
    with pytest.raises(FileNotFoundError, match="absent: no such file \\(no replay report"):
        load_report(tmp_path / "absent")
