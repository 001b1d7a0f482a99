"""`tiertp bench gateway --json` runs end to end on a small load."""

from __future__ import annotations

import json

from tiertp.cli import main


def test_bench_gateway_quick_json(capsys):
    assert main(["bench", "gateway", "--json", "--quick", "--requests", "500", "--concurrency", "8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["benchmark"] == "gateway"
    assert result["requests"] == 500 and result["errors"] == 0
    assert result["req_per_s"] > 0 and 0 < result["p50_ms"] <= result["p99_ms"]
