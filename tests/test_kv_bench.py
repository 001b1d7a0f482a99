"""`tiertp bench kv-migration` runs end to end on a tiny KV (figures not checked:
timings belong to the benchmark, not to tests)."""

import argparse

from tiertp.bench import BENCHES, kv_migration


def test_bench_is_registered():
    assert BENCHES["kv-migration"] == "tiertp.bench.kv_migration"


def test_bench_reports_every_method_for_every_size():
    parser = argparse.ArgumentParser()
    kv_migration.add_arguments(parser)
    args = parser.parse_args(["--tokens", "64,100", "--layers", "2", "--kv-heads", "2", "--head-dim", "8",
                              "--chunk-mib", "0.001", "--timeout", "120"])
    out = kv_migration.run(args)
    assert set(out["tokens"]) == {"64", "100"}
    for size, fig in out["tokens"].items():
        for key in ("per_page_s", "aggregate_s", "pipelined_s", "pipelined_gbps", "contiguous_gbps"):
            assert fig[key] > 0, (size, key)
        assert fig["bytes"] == -(-int(size) // 16) * 16 * 2 * 2 * 2 * 8 * 2  # pages * page bytes (2 heads)
