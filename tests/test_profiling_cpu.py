"""`tiertp profile --quick` on the real engine (CPU, tiny random Llama), and its errors.

The command runs as `python -m tiertp.cli profile ...` in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tiertp.profiling import checkpoint, grid, run_profile

pytestmark = pytest.mark.slow

_TIMEOUT_S = 420


def _profile(*args: str, timeout: float = _TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tiertp.cli", "profile", "--no-progress", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def test_quick_profile_resumes_and_passes_the_loader(tmp_path):
    from tiertp import _scheduler as scheduler
    out = tmp_path / "tiny.json"
    quick = grid.grid_for("cpu", True)
    # A run interrupted after TP1's prefill cells: those come from the
    # checkpoint (marked with an impossible-to-measure 1e6 ms), the rest is measured.
    ckpt = checkpoint.checkpoint_path(out)
    checkpoint.open_checkpoint(ckpt, run_profile.checkpoint_header("tiny-llama", "cpu", quick, 0))
    done = [c for c in grid.measured_cells(quick) if c.table == grid.PREFILL]
    for c in done:
        checkpoint.append_record(
            ckpt, {"kind": "cell", "tp": 1, "table": c.table, "x": c.x, "y": c.y, "latency_ms": 1e6, "spread_ms": 0.0}
        )

    r = _profile("--model", "tiny-llama", "--tp", "1,2", "--device", "cpu", "--quick", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert not ckpt.exists()

    prof = scheduler.Profile.load(str(out))
    assert prof.tp_levels == [1, 2] and prof.model == "tiny-llama" and prof.dtype == "float32"
    doc = json.loads(out.read_text())
    assert doc["tp_levels"]["1"]["prefill"]["latency_ms"] == [[1e6] * len(quick.prefill_batch_size)] * len(
        quick.prefill_batch_tokens
    )
    for tp in ("1", "2"):
        dec = doc["tp_levels"][tp]["decode"]
        assert dec["batch_size"] == [float(b) for b in quick.decode_batch_size]
        assert all(0 < v < 1e6 for row in dec["latency_ms"] for v in row)
    assert all(0 < v < 1e6 for row in doc["tp_levels"]["2"]["prefill"]["latency_ms"] for v in row)
    assert doc["provenance"]["software"]["sglang"] == "0.5.23"
    assert doc["kv_bytes_per_token"] == 2 * 8 * 32 * 2 * 4  # layers x KV heads x head_dim x (K,V) x fp32


def test_cuda_without_gpu_fails_clearly(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    r = _profile("--model", "tiny-llama", "--device", "cuda", "--quick", "--out", str(tmp_path / "x.json"), timeout=120)
    assert r.returncode == 2
    assert "no CUDA GPU" in r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "1,0"], "not a TP level"),
        (["--model", "no-such-model"], "smollm2-135m, tiny-llama"),
        (["--model", "smollm2-135m", "--tp", "1,2"], "do not fit smollm2-135m"),
    ],
)
def test_bad_arguments_are_named(tmp_path, args, message):
    r = _profile(*args, "--out", str(tmp_path / "x.json"), timeout=120)
    assert r.returncode == 2
    assert message in r.stderr
