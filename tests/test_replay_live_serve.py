"""Live replay end to end on CPU: `tiertp serve` (SmolLM2-135M, 2 devices,
two SLO tiers) and a short scaled Azure trace window replayed against it
with `tiertp replay --live`; every request must be accounted for (completed,
or failed with a reason) and the report must be written and parse. Then
`tiertp fidelity --url` on the same server (a tiny load, a given profile).
Asserts behaviour only, never timings."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tiertp.fidelity.defaults import TIERS_CPU_TWO_TIER
from tiertp.fidelity.serve_process import ServeProcess
from tiertp.profile_source import SYNTHETIC

pytestmark = pytest.mark.slow

TIMEOUT_S = 600
WORKLOAD = ["--trace", "azure-conv", "--tier-fractions", "chat=0.5,agent=0.5", "--tiers", str(TIERS_CPU_TWO_TIER),
            "--max-prompt-tokens", "48", "--max-output-tokens", "6", "--no-progress"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tiertp.data import data_dir

    try:
        data_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    serve = ServeProcess("smollm2-135m", 2, TIERS_CPU_TWO_TIER, tmp_path_factory.mktemp("serve"), profile=SYNTHETIC)
    try:
        yield serve.wait_url()
    finally:
        code = serve.stop()
    assert code == 0, f"tiertp serve did not stop cleanly (exit {code}); see {serve.output_path}"


def tiertp(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "tiertp.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"tiertp {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_replay_live_accounts_for_every_request(served, tmp_path):
    out = tmp_path / "report"
    tiertp("replay", "--live", served, "--rps", "1.0", "--duration", "16", "--out", str(out), *WORKLOAD)
    doc = json.loads((out / "report.json").read_text())
    load = doc["loads"][0]
    n = load["requests"]
    assert n == 16
    live = load["policies"]["live"]
    assert live["completed"] + live["live"]["failed"] == n
    assert live["live"]["completed"] == live["completed"]
    assert doc["length_caps"] == {"max_prompt_tokens": 48, "max_output_tokens": 6}
    assert {t["tier"] for t in live["tiers"] if t["requests"]} == {"chat", "agent"}
    rows = list(csv.DictReader(open(out / "requests-1.0rps.csv")))
    assert len(rows) == n and sorted(int(r["index"]) for r in rows) == list(range(n))
    for r in rows:
        assert r["status"] in ("completed", "failed")
        assert int(r["prompt_tokens"]) <= 48 and int(r["max_tokens"]) <= 6
        if r["status"] == "failed":
            assert r["failure_kind"] and r["error_message"]
        else:
            assert float(r["ttft_ms"]) > 0 and 1 <= int(r["completion_tokens"]) <= int(r["max_tokens"])
    assert {r["tier"] for r in csv.DictReader(open(out / "report.csv"))} == {"chat", "agent"}
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 3 and all((out / p).stat().st_size > 0 for p in pngs)


def test_fidelity_against_the_running_server(served, tmp_path):
    from test_fidelity import profile_doc

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_doc()))
    out = tmp_path / "fidelity"
    proc = tiertp("fidelity", "--url", served, "--profile", str(profile), "--rps", "1.0", "--duration", "6",
                  "--out", str(out), "--no-plots", *WORKLOAD)
    assert "simulated tiertp vs measured" in proc.stdout
    doc = json.loads((out / "fidelity.json").read_text())
    load = doc["loads"][0]
    assert load["live"]["completed"] + load["live"]["failed"] == load["requests"] == 6
    assert doc["devices"] == 2 and doc["simulator"]["gpus"] == 2
    assert doc["command_line"][:4] == ["tiertp", "fidelity", "--url", served]
