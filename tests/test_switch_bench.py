"""`tiertp bench switch` is registered and reports its keys and the KV it
moved (never timings, which vary by machine). Starts three tiny-llama
instances in turn."""

from __future__ import annotations

import argparse

import pytest

from tiertp.bench import BENCHES, switch

pytestmark = pytest.mark.slow


def test_bench_is_registered():
    assert BENCHES["switch"] == "tiertp.bench.switch"


def test_small_run_reports_stop_and_restart_times():
    parser = argparse.ArgumentParser()
    switch.add_arguments(parser)
    out = switch.run(parser.parse_args(["--tokens", "0,100", "--repeat", "1"]))
    assert set(out["stop_ms"]) == {"0", "100"} and out["restart_ms"] > 0
    assert all(v > 0 for v in out["stop_ms"].values())
    # 100 tokens of KV plus the one each (single) request decoded before the switch; TP1 -> TP2 moves every head once.
    assert out["moved"]["100"]["kv_tokens"] == 101
    assert out["moved"]["100"]["bytes_between"] == 101 * 2 * 2 * 8 * 32 * 4  # tokens x layers x K,V x heads x dim x fp32
    # The bench warms its instances (pools shared): the TP2 ranks pull every byte out of the TP1 rank's pool.
    assert out["moved"]["100"]["bytes_pulled"] == out["moved"]["100"]["bytes_between"]
    assert out["moved"]["0"] == {"kv_tokens": 0, "bytes_between": 0, "bytes_pulled": 0}
