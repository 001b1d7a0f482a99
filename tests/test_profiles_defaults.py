"""The shipped default profiles (tiertp/profiles/defaults/): found by name,
accepted by the planner's loader, reproducible from the kernel data, and
showing the TP effects the planner relies on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiertp import _scheduler
from tiertp.cli import main as cli_main
from tiertp.data import data_dir
from tiertp.profiles import resolve, shipped
from tiertp.profiles.gpus import GPUS
from tiertp.profiles.models import MODELS

ALL = [(g, m) for g in GPUS for m in MODELS]
# Llama-3.1-70B's 141 GB of bf16 weights fit on no single GPU here (H200
# included: 141 GB of HBM less the activation reserve), so its tables start
# at TP 2; the smaller models have every level.
EXPECTED_TP = {"llama-3.1-8b": [1, 2, 4, 8], "qwen2.5-14b": [1, 2, 4, 8], "llama-3.1-70b": [2, 4, 8]}


def load_json(gpu: str, model: str) -> dict:
    return json.loads(resolve(gpu, model).read_text())


def prefill(p: dict, tp: int, tokens: int, batch: int = 1) -> float:
    t = p["tp_levels"][str(tp)]["prefill"]
    return t["latency_ms"][t["batch_tokens"].index(tokens)][t["batch_size"].index(batch)]


def decode(p: dict, tp: int, batch: int, context: int) -> float:
    t = p["tp_levels"][str(tp)]["decode"]
    return t["latency_ms"][t["batch_size"].index(batch)][t["context_len"].index(context)]


# -- selection by name -----------------------------------------------------


def test_every_gpu_model_pair_is_shipped():
    assert {p.name for p in shipped()} == {f"{g}--{m}.json" for g, m in ALL}


@pytest.mark.parametrize("gpu", ["h100", "H100_SXM", "h100-sxm"])
def test_resolve_accepts_gpu_spellings_and_model_aliases(gpu):
    assert resolve(gpu, "llama-3.1-8b").name == "h100_sxm--llama-3.1-8b.json"
    assert resolve(gpu, "DeepSeek-R1-Distill-Qwen-14B").name == "h100_sxm--qwen2.5-14b.json"


def test_resolve_lists_valid_names_for_unknown_ones():
    with pytest.raises(ValueError, match=r"unknown GPU 'b200'; valid GPUs: a100, .*h200_sxm"):
        resolve("b200", "llama-3.1-8b")
    with pytest.raises(ValueError, match=r"unknown model 'mistral-7b'; valid models: .*llama-3.1-70b"):
        resolve("h100", "mistral-7b")


# -- the loader ----------------------------------------------------------


@pytest.mark.parametrize("gpu, model", ALL)
def test_shipped_table_loads_with_expected_tp_levels(gpu, model):
    p = _scheduler.Profile.load(str(resolve(gpu, model)))
    assert (p.gpu, p.model, p.dtype) == (gpu, model, "bfloat16")
    assert p.tp_levels == EXPECTED_TP[model]
    assert p.kv_bytes_per_token == MODELS[model].kv_bytes_per_token
    raw = load_json(gpu, model)
    caps = [raw["tp_levels"][str(tp)]["kv_capacity_tokens"] for tp in EXPECTED_TP[model]]
    assert caps == sorted(caps) and caps[0] >= 8192


def test_shipped_tables_are_small_and_carry_provenance():
    for path in shipped():
        assert path.stat().st_size < 300_000, path.name
        prov = json.loads(path.read_text())["provenance"]
        assert "095f58a" in prov["source"]["upstream"] and "SGLang 0.5.10" in prov["source"]["upstream"]
        assert prov["source_versions"]["gemm"] == "SGLang 0.5.10"
        assert prov["constants"]["scheduler_overhead_ms_per_step"] > 0
        assert prov["model_shape"]["layers"] > 0 and prov["generated"]


@pytest.fixture
def good_text() -> str:
    return resolve("h100", "llama-3.1-8b").read_text()


def test_loader_rejects_truncated_file(tmp_path, good_text):
    path = tmp_path / "cut.json"
    path.write_text(good_text[: len(good_text) // 2])
    with pytest.raises(_scheduler.ProfileError, match=r"cut\.json: not a valid tiertp profile: EOF"):
        _scheduler.Profile.load(str(path))


def test_loader_rejects_corrupt_json(tmp_path, good_text):
    path = tmp_path / "bad.json"
    path.write_text(good_text.replace('"version": 1', '"version": 1,,', 1))
    with pytest.raises(_scheduler.ProfileError, match=r"bad\.json: not a valid tiertp profile"):
        _scheduler.Profile.load(str(path))


def corrupt(text: str, edit) -> str:
    data = json.loads(text)
    edit(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda d: d["tp_levels"]["2"]["decode"]["latency_ms"][3].__setitem__(4, -1.0),
         r"field `tp_levels\.2\.decode\.latency_ms\[3\]\[4\]` = -1: must be a finite number > 0"),
        (lambda d: d["tp_levels"]["1"]["prefill"]["latency_ms"][5].pop(),
         r"field `tp_levels\.1\.prefill\.latency_ms\[5\]` = 11 values: expected 12 values"),
        (lambda d: d["tp_levels"]["4"]["decode"]["context_len"].__setitem__(1, 100),
         r"field `tp_levels\.4\.decode\.context_len\[1\]` = 100: axis must be strictly increasing"),
        (lambda d: d["tp_levels"].__setitem__("16", d["tp_levels"]["8"]),
         r"field `tp_levels\.16`"),
        (lambda d: d.__setitem__("format", "other"), r"field `format`"),
        (lambda d: d["tp_levels"]["1"].pop("decode"), r"missing field `decode`"),
    ],
)
def test_loader_names_the_bad_field(good_text, edit, problem):
    with pytest.raises(_scheduler.ProfileError, match=r"^h100\.json: .*" + problem):
        _scheduler.Profile.from_json(corrupt(good_text, edit), "h100.json")


# -- reproducible from the kernel data ------------------------------------


@pytest.mark.parametrize("gpu", list(GPUS))
def test_build_defaults_reproduces_the_shipped_tables(tmp_path, gpu):
    root = data_dir()  # raises, saying where the public data comes from
    shipped_text = {m: resolve(gpu, m).read_text() for m in MODELS}
    date = json.loads(shipped_text["llama-3.1-8b"])["provenance"]["generated"]
    rc = cli_main(["profile", "build-defaults", "--data", str(root), "--gpu", gpu, "--out", str(tmp_path), "--date", date])
    assert rc == 0
    for model, text in shipped_text.items():
        assert (tmp_path / f"{gpu}--{model}.json").read_text() == text, (
            f"{gpu}--{model}.json is stale: run `tiertp profile build-defaults` and commit the result"
        )


def test_build_defaults_rejects_unknown_names():
    assert cli_main(["profile", "build-defaults", "--gpu", "tpu-v5"]) == 2


# -- the effects the planner relies on -------------------------------------


@pytest.mark.parametrize("gpu, model", ALL)
def test_tables_are_monotone(gpu, model):
    for level in load_json(gpu, model)["tp_levels"].values():
        pre = level["prefill"]["latency_ms"]
        dec = level["decode"]["latency_ms"]
        assert all(a <= b for r0, r1 in zip(pre, pre[1:]) for a, b in zip(r0, r1)), "prefill vs batch tokens"
        assert all(a <= b for r0, r1 in zip(dec, dec[1:]) for a, b in zip(r0, r1)), "decode vs batch size"
        assert all(a <= b for row in dec for a, b in zip(row, row[1:])), "decode vs context"


@pytest.mark.parametrize("gpu, model", ALL)
@pytest.mark.parametrize("tokens", [4096, 8192, 16384, 32768])
def test_higher_tp_lowers_long_prompt_prefill(gpu, model, tokens):
    p = load_json(gpu, model)
    times = [prefill(p, tp, tokens) for tp in EXPECTED_TP[model]]
    assert times == sorted(times, reverse=True) and len(set(times)) == len(times), times


def per_gpu_decode_rate(p: dict, tp: int, batch: int, context: int = 2048) -> float:
    """Tokens/s per GPU of a TP group decoding `batch` sequences."""
    return batch / (decode(p, tp, batch, context) / 1e3) / tp


@pytest.mark.parametrize("gpu", list(GPUS))
def test_tp2_decode_per_gpu_advantage_at_small_batch_shrinks_at_large(gpu):
    # Compared at the same load per GPU (a TP 2 group holds 2b sequences
    # where two TP 1 replicas hold b each), TP 2 decodes more tokens/s per
    # GPU at small batches (1.35-1.56x at b = 1: each GPU streams half the
    # weights per step), the advantage shrinks as the GEMMs turn
    # compute-bound, and by 256 sequences per GPU it has reversed (TP 1
    # ahead by 2-10%).
    p = load_json(gpu, "llama-3.1-8b")
    ratio = {b: per_gpu_decode_rate(p, 2, 2 * b) / per_gpu_decode_rate(p, 1, b) for b in (1, 4, 16, 64, 256)}
    assert ratio[1] > 1.3 and ratio[4] > 1.3
    assert ratio[1] > ratio[16] > ratio[64] > ratio[256]
    assert ratio[256] < 1.0


@pytest.mark.parametrize("gpu", list(GPUS))
def test_tp2_decode_at_equal_batch_is_worse_per_gpu(gpu):
    # What the data show for the literal comparison (the same batch on one
    # GPU and on a TP 2 pair): TP 2 never wins per GPU -- that would take a
    # 2x speed-up, and all-reduces, the per-kernel floor and the scheduler
    # overhead hold it to 1.4-1.6x at batch 1 (per-GPU ratio 0.70-0.80) --
    # but it cuts the step time (what a tight TPOT SLO needs), and its
    # per-GPU deficit narrows at large batches (0.87-0.91 at 512).
    p = load_json(gpu, "llama-3.1-8b")
    ratio = {b: per_gpu_decode_rate(p, 2, b) / per_gpu_decode_rate(p, 1, b) for b in (1, 64, 512)}
    assert all(r < 1 for r in ratio.values())
    assert ratio[512] > ratio[1]
    assert decode(p, 2, 1, 2048) < decode(p, 1, 1, 2048)
