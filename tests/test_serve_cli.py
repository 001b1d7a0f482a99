"""`tiertp serve` refuses bad input at start-up with an error naming it,
before it starts any process: a corrupt or unsuitable --profile, a tier file
with a bad limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tiertp.profiles import resolve

pytestmark = pytest.mark.slow

TIMEOUT_S = 120


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tiertp.cli", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def refused(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr[r.stderr.find("tiertp serve: error: "):]
    assert err, r.stderr
    for n in needles:
        assert n in err, err
    assert "starting the agent" not in r.stdout + r.stderr


def test_corrupt_profile(tmp_path: Path):
    bad = tmp_path / "profile.json"
    bad.write_text('{"format": "tiertp-profile", "tp_levels": ')
    refused(serve("--profile", str(bad)), f"--profile {bad}", "not a valid tiertp profile")
    refused(serve("--profile", str(tmp_path / "missing.json")), "no such file")


def test_profile_without_the_workers_tp_level(tmp_path: Path):
    doc = json.loads(resolve("h100", "llama-3.1-8b").read_text())
    del doc["tp_levels"]["1"]
    path = tmp_path / "no-tp1.json"
    path.write_text(json.dumps(doc))
    refused(serve("--profile", str(path)), "no table for TP level(s) [1]")


@pytest.mark.parametrize("line, field", [("max_concurrent_requests = 0", "`max_concurrent_requests` = 0"),
                                         ("max_requests_per_minute = -2", "`max_requests_per_minute` = -2"),
                                         ("max_rps = 5", "unknown field")])
def test_bad_tier_limits(tmp_path: Path, line: str, field: str):
    tiers = tmp_path / "tiers.toml"
    tiers.write_text(f'[[tier]]\nname = "chat"\nttft_ms = 500\ntpot_ms = 50\napi_keys = ["k"]\n{line}\n')
    refused(serve("--tiers", str(tiers)), field)


@pytest.mark.parametrize("args, needle", [
    (("--tp-levels", "1,3", "--devices", "4"), "--tp-levels must be powers of two"),
    (("--tp-levels", "1,2"), "--tp-levels 2 needs at least that many devices"),
    (("--tp-levels", "2", "--devices", "2"), "must include 1"),
    # SmolLM2 (the default model) has 9 attention heads: TP2 cannot split them.
    (("--tp-levels", "1,2", "--devices", "2"), "do not split evenly over TP 2"),
])
def test_bad_tp_levels(args, needle):
    refused(serve(*args), needle)


def test_unknown_sampling_defaults_lists_the_choices():
    refused(serve("--sampling-defaults", "vllm"), "--sampling-defaults", "'model'", "'openai'")


def test_help_says_what_each_sampling_default_does():
    r = subprocess.run([sys.executable, "-m", "tiertp.cli", "serve", "--help"], capture_output=True, text=True,
                       timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "--sampling-defaults {model,openai}" in text
    assert "generation_config.json" in text and "temperature 1.0, top_p 1.0" in text
