"""The kernel-table interpolation and the step composer (tiertp.profiles).

Hand computations run on tiny synthetic kernel tables, so every expected
number is written out here; the last tests read the real measured tables
from the public data (gpu-kernels/), which CI has beside the checkout.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from tiertp.data import data_path
from tiertp.profiles.compose import Composer, Elementwise
from tiertp.profiles.gpus import GPUS, get_gpu
from tiertp.profiles.kernels import KernelTables
from tiertp.profiles.models import MODELS, ModelShape, get_model

# A 2-layer model small enough to list every kernel row it needs at TP 2:
# per GPU 2 query heads / 1 KV head, QKV n = (512 + 2*256)/2 = 512,
# O k = 512/2 = 256, gate/up n = 2*768/2 = 768, down k = 768/2 = 384,
# LM head n = 2048/2 = 1024.
TINY = ModelShape(
    name="tiny", hf_id="-", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=128,
    intermediate=768, vocab=2048,
)
# Elementwise kernels at 1e8 bytes/ms, none faster than 0.006 ms.
EW = Elementwise(bandwidth=1e8, floor_ms=0.006)
OVERHEAD = 0.5

QKV, ATTN, O, GATE_UP, DOWN = 0.011, 0.023, 0.013, 0.017, 0.019
AR_EAGER, AR_GRAPH, LM_HEAD, GATHER = 0.029, 0.007, 0.031, 0.037


def gemm_rows(m: int) -> list[dict]:
    return [
        {"m": m, "n": 512, "k": 256, "latency": QKV},
        {"m": m, "n": 256, "k": 256, "latency": O},
        {"m": m, "n": 768, "k": 256, "latency": GATE_UP},
        {"m": m, "n": 256, "k": 384, "latency": DOWN},
    ]


def tiny_tables() -> KernelTables:
    return KernelTables.from_records(
        gemm=[
            *gemm_rows(512),  # prefill: 512 tokens
            *gemm_rows(4),  # decode: batch 4
            {"m": 2, "n": 1024, "k": 256, "latency": LM_HEAD},  # prefill logits: 2 prompts
            {"m": 4, "n": 1024, "k": 256, "latency": LM_HEAD},  # decode logits
        ],
        context_attention=[
            {"batch_size": 2, "isl": 256, "num_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "latency": ATTN}
        ],
        generation_attention=[
            # step = tokens cached before the new one: context 1024 is step 1023
            {"batch_size": 4, "step": 1023, "num_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "latency": ATTN}
        ],
        allreduce=[
            {"backend": "sglang_eager", "num_gpus": 2, "message_size": 512 * 256, "latency": AR_EAGER},
            {"backend": "sglang_graph", "num_gpus": 2, "message_size": 4 * 256, "latency": AR_GRAPH},
        ],
        nccl=[
            {"op_name": "all_gather", "num_gpus": 2, "message_size": 2 * 2048, "latency": GATHER},
            {"op_name": "all_gather", "num_gpus": 2, "message_size": 4 * 2048, "latency": GATHER},
        ],
    )


def test_prefill_layer_and_step_match_hand_computation():
    step = Composer(TINY, tiny_tables(), tp=2, overhead_ms=OVERHEAD, elementwise=EW).prefill(512, 2)
    # elementwise bytes for 512 tokens on one GPU (bf16), / 1e8 bytes/ms, floor 0.006:
    elementwise = (
        4 * 512 * 256 * 2 / 1e8  # add+RMSNorm      0.01048576
        + 2 * 512 * (512 + 256) / 2 * 2 / 1e8  # RoPE    0.00786432
        + 0.006  # KV store: 524288 bytes = 0.00524288 ms, under the floor
        + 4 * 512 * 256 * 2 / 1e8  # add+RMSNorm      0.01048576
        + 3 * 512 * 768 / 2 * 2 / 1e8  # SiLU * up   0.01179648
    )
    layer = QKV + ATTN + O + GATE_UP + DOWN + 2 * AR_EAGER + elementwise
    assert step.layer_ms == pytest.approx(0.18763232, rel=1e-12)
    assert layer == pytest.approx(0.18763232, rel=1e-12)
    embedding = 0.006 + AR_EAGER  # lookup (under the floor) + all-reduce
    final_norm = 3 * 512 * 256 * 2 / 1e8
    assert step.step == pytest.approx(
        {"embedding": embedding, "final_norm": final_norm, "lm_head": LM_HEAD, "logits_gather": GATHER, "overhead": OVERHEAD}
    )
    assert step.total_ms == pytest.approx(2 * 0.18763232 + 0.035 + 0.00786432 + 0.031 + 0.037 + 0.5, rel=1e-12)


def test_decode_layer_uses_generation_attention_and_graph_allreduce():
    step = Composer(TINY, tiny_tables(), tp=2, overhead_ms=OVERHEAD, elementwise=EW).decode(4, 1024)
    assert step.layer == pytest.approx(
        {
            "gemm_qkv": QKV, "attention": ATTN, "gemm_o": O, "gemm_gate_up": GATE_UP, "gemm_down": DOWN,
            "allreduce": 2 * AR_GRAPH,
            "elementwise": 5 * 0.006,  # 4 tokens: every kernel is at the floor
        }
    )
    assert step.total_ms == pytest.approx(2 * step.layer_ms + (0.006 + AR_GRAPH) + 0.006 + LM_HEAD + GATHER + OVERHEAD)


def test_tp1_has_no_communication():
    t = KernelTables.from_records(
        gemm=[{"m": 8, "n": n, "k": k, "latency": 0.01} for n in (256, 1024, 1536, 4096) for k in (256, 512, 1536)],
        generation_attention=[
            {"batch_size": 8, "step": 511, "num_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "latency": 0.02}
        ],
    )
    step = Composer(TINY, t, tp=1, elementwise=EW).decode(8, 512)
    assert step.layer["allreduce"] == 0.0 and step.step["logits_gather"] == 0.0


# -- interpolation ---------------------------------------------------------


def gemm_table() -> KernelTables:
    return KernelTables.from_records(
        gemm=[
            {"m": 64, "n": 512, "k": 256, "latency": 1.0},
            {"m": 256, "n": 512, "k": 256, "latency": 4.0},
        ]
    )


@pytest.mark.parametrize(
    "m, expected",
    [
        (64, 1.0),
        (128, 2.0),  # log-log midway: sqrt(1 * 4)
        (100, 100 / 64),  # slope 1 between the rows, so proportional
        (16, 1.0),  # below the smallest m: its latency (the floor)
        (1024, 16.0),  # above the largest m: proportional to m
    ],
)
def test_gemm_interpolates_log_log_in_m(m, expected):
    assert gemm_table().gemm(m, 512, 256) == pytest.approx(expected)


def test_gemm_beyond_largest_n_scales_proportionally():
    assert gemm_table().gemm(256, 2048, 256) == pytest.approx(16.0)


def test_gemm_without_neighbouring_rows_names_the_shape():
    with pytest.raises(ValueError, match="no GEMM rows for n=512, k=512"):
        KernelTables.from_records(
            gemm=[{"m": 1, "n": 512, "k": 256, "latency": 1.0}, {"m": 1, "n": 1024, "k": 512, "latency": 1.0}]
        ).gemm(1, 700, 300)


def attn_rows(heads: int, x_col: str, points: dict[int, float]) -> list[dict]:
    return [
        {"batch_size": 1, x_col: x, "num_heads": heads, "num_key_value_heads": 1, "head_dim": 128, "latency": y}
        for x, y in points.items()
    ]


def test_attention_heads_interpolate_linearly_at_equal_kv_heads():
    t = KernelTables.from_records(
        context_attention=attn_rows(2, "isl", {1024: 1.0}) + attn_rows(4, "isl", {1024: 3.0})
    )
    assert t.context_attention(1, 1024, 3, 1) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no rows around 8 heads / 1 KV heads"):
        t.context_attention(1, 1024, 8, 1)


def test_context_attention_extrapolates_by_clamped_power_law():
    quadratic = KernelTables.from_records(context_attention=attn_rows(1, "isl", {1024: 1.0, 2048: 4.0}))
    assert quadratic.context_attention(1, 4096, 1, 1) == pytest.approx(16.0)
    cubic = KernelTables.from_records(context_attention=attn_rows(1, "isl", {1024: 1.0, 2048: 8.0}))
    assert cubic.context_attention(1, 4096, 1, 1) == pytest.approx(32.0)  # slope clamped to 2


def test_generation_attention_extrapolates_linearly_in_kv_len():
    # steps 1023, 2047 are kv_len 1024, 2048
    t = KernelTables.from_records(generation_attention=attn_rows(1, "step", {1023: 1.0, 2047: 1.5}))
    assert t.generation_attention(1, 2048, 1, 1) == pytest.approx(1.5)
    assert t.generation_attention(1, 4096, 1, 1) == pytest.approx(2.5)


def test_generation_slope_is_the_median_rate_per_cached_token():
    # last segments: batch 1 adds 0.5 ms per 1024 tokens per sequence, batch
    # 2 adds 2.0 ms per 2 x 1024: rates 0.5/1024 and 1/1024, median 0.75/1024
    rows = attn_rows(1, "step", {1023: 1.0, 2047: 1.5})
    rows += [dict(r, batch_size=2, latency=y) for r, y in zip(attn_rows(1, "step", {1023: 0, 2047: 0}), (1.0, 3.0))]
    t = KernelTables.from_records(generation_attention=rows)
    assert t.generation_attention(1, 4096, 1, 1) == pytest.approx(1.5 + 0.75 / 1024 * 2048)
    assert t.generation_attention(2, 4096, 1, 1) == pytest.approx(3.0 + 2 * 0.75 / 1024 * 2048)


def test_missing_collective_names_what_is_there():
    t = KernelTables.from_records(
        allreduce=[{"backend": "sglang_graph", "num_gpus": 2, "message_size": 1024, "latency": 0.01}]
    )
    assert t.all_reduce(512, 2, graph=True) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="no nccl_all_reduce rows for 4 GPUs"):
        t.all_reduce(512, 4, graph=True)


def test_composer_refuses_uneven_head_split_and_unmeasured_head_dim():
    with pytest.raises(ValueError, match="TP 8 does not split 4 heads / 2 KV heads"):
        Composer(TINY, gemm_table(), tp=8)
    with pytest.raises(ValueError, match="head_dim 64; the kernel tables measure only 128"):
        Composer(dataclasses.replace(TINY, head_dim=64), gemm_table(), tp=1)


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError, match="valid GPUs: .*h100"):
        get_gpu("v100")
    with pytest.raises(ValueError, match="valid models: .*llama-3.1-8b"):
        get_model("llama-2-7b")


def test_model_shapes_match_published_sizes():
    # parameter counts and KV bytes per token the model cards give
    assert MODELS["llama-3.1-8b"].params == pytest.approx(8.03e9, rel=0.005)
    assert MODELS["qwen2.5-14b"].params == pytest.approx(14.77e9, rel=0.005)
    assert MODELS["llama-3.1-70b"].params == pytest.approx(70.55e9, rel=0.005)
    assert MODELS["llama-3.1-8b"].kv_bytes_per_token == 32 * 2 * 8 * 128 * 2


# -- the real kernel tables ----------------------------------------------


@pytest.fixture(scope="module")
def h100() -> KernelTables:
    # data_path raises FileNotFoundError saying where the data comes from
    return KernelTables.load(data_path("gpu-kernels", "h100_sxm"), expect_device=GPUS["h100_sxm"].device)


def test_measured_tables_load_with_their_provenance(h100):
    assert h100.devices == {"NVIDIA H100 80GB HBM3"}
    assert h100.versions["gemm"] == "SGLang 0.5.10"
    # the HBM rate read off the m = 1 GEMMs is an H100's (3.35 TB/s peak)
    assert 2.0e9 < h100.stream_bandwidth() < 3.35e9


def test_measured_tables_cover_every_shape_the_defaults_need(h100):
    for model in MODELS.values():
        for tp in (1, 2, 4, 8):
            c = Composer(model, h100, tp)
            for step in (c.prefill(32768, 1), c.prefill(64, 64), c.decode(512, 131072), c.decode(1, 128)):
                assert math.isfinite(step.total_ms) and step.total_ms > 0


def test_tp_shards_the_gemms(h100):
    one, two = (Composer(MODELS["llama-3.1-8b"], h100, tp).prefill(8192, 1) for tp in (1, 2))
    for name in ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down"):
        assert two.layer[name] < one.layer[name]
    assert one.layer["allreduce"] == 0 < two.layer["allreduce"]


def test_load_names_a_missing_table(tmp_path):
    with pytest.raises(FileNotFoundError, match="gemm_perf.parquet"):
        KernelTables.load(tmp_path)


def test_load_refuses_another_gpus_tables():
    with pytest.raises(ValueError, match="expected 'NVIDIA H200'"):
        KernelTables.load(data_path("gpu-kernels", "h100_sxm"), expect_device="NVIDIA H200")
