"""`tiertp bench kv-migration` runs end to end on a tiny KV (figures not checked:
timings belong to the benchmark, not to tests)."""

import argparse

import pytest

from tiertp.bench import BENCHES, kv_migration

pytestmark = pytest.mark.slow

KEYS = ("per_page_s", "aggregate_s", "pipelined_s", "pipelined_gbps", "contiguous_gbps")


def test_bench_is_registered():
    assert BENCHES["kv-migration"] == "tiertp.bench.kv_migration"


def _run(*extra):
    parser = argparse.ArgumentParser()
    kv_migration.add_arguments(parser)
    # 64 tokens = 4 pages (all sent per page), 100 tokens = 7 pages (a 5-page sample, scaled).
    args = parser.parse_args(["--tokens", "64,100", "--page-size", "16", "--layers", "2", "--kv-heads", "2",
                              "--head-dim", "8",
                              "--chunk-mib", "0.001", "--timeout", "120", "--per-page-sample", "5", "--repeat", "2",
                              *extra])
    return kv_migration.run(args)


def test_defaults_are_gloo_with_repeats():
    parser = argparse.ArgumentParser()
    kv_migration.add_arguments(parser)
    args = parser.parse_args([])
    assert args.transport == "dist" and args.page_size == 1 and args.repeat >= 3 and args.per_page_sample > 0


@pytest.mark.parametrize("transport", ["dist", "shm"])
def test_bench_reports_every_method_for_every_size(transport):
    out = _run("--transport", transport)
    assert out["transport"] == transport and out["repeat_stat"] in ("min", "median") and out["notes"]
    assert set(out["tokens"]) == {"64", "100"}
    for size, fig in out["tokens"].items():
        for key in KEYS:
            assert fig[key] > 0, (size, key)
        assert fig["bytes"] == -(-int(size) // 16) * 16 * 2 * 2 * 2 * 8 * 2  # pages * page bytes (2 heads)
        assert len(fig["pipelined_runs_s"]) == len(fig["per_page_runs_s"]) == 2
    small, big = out["tokens"]["64"], out["tokens"]["100"]
    assert (small["per_page_measured_pages"], small["per_page_total_pages"], small["per_page_extrapolated"]) == \
        (4, 4, False)
    assert (big["per_page_measured_pages"], big["per_page_total_pages"], big["per_page_extrapolated"]) == \
        (5, 7, True)
    assert out["target_met_40k"] is None  # no 40960 entry in this run


def test_per_page_sample_is_spread_and_differs_per_round():
    from tiertp.kv.bench_worker import _sample

    assert _sample(7, 10, 0, 3) == list(range(7))  # small request: every page, every round
    rounds = [_sample(2560, 64, r, 3) for r in range(3)]
    for pos in rounds:
        assert len(set(pos)) == 64 and 0 <= min(pos) < 40 and 2560 - 40 <= max(pos) < 2560
        assert max(b - a for a, b in zip(pos, pos[1:])) <= 41
    assert not set(rounds[0]) & set(rounds[1])


def test_kernel_bench_reports_every_figure_on_cpu():
    from tiertp.bench import kv_kernels

    assert BENCHES["kv-kernels"] == "tiertp.bench.kv_kernels"
    parser = argparse.ArgumentParser()
    kv_kernels.add_arguments(parser)
    out = kv_kernels.run(parser.parse_args(["--device", "cpu", "--tokens", "40", "--page-sizes", "1,16", "--layers",
                                            "2", "--kv-heads", "2", "--head-dim", "8", "--repeat", "1"]))
    assert out["device"] == "cpu" and [(r["tokens"], r["page_size"]) for r in out["results"]] == [(40, 1), (40, 16)]
    for row in out["results"]:
        assert row["kernels"] == "cpu" and row["chunk_mib"] == 16
        for key in ("gather_all_heads_gbps", "gather_half_heads_gbps", "scatter_all_heads_gbps",
                    "contiguous_copy_gbps", "migrate_gbps", "migrate_staged_gbps"):
            assert row[key] >= 0, key  # rounded: a tiny KV can show 0.0
        assert row["migrate_ms"] > 0 and row["migrate_staged_ms"] > 0
