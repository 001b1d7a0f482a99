"""schemathesis fuzzes a live gateway (over mock agents, no model) from its own
/openapi.json, with the tier's API key: every operation, at most MAX_EXAMPLES
cases per operation and phase (coverage, then fuzzing), deterministic, with all
of schemathesis's checks: no 5xx, every status, content type, header and body
(JSON and each Server-Sent Event) as documented, requests valid by the schema
accepted and invalid ones refused, auth enforced. The counts are printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tiertp._scheduler import MockGateway

MAX_EXAMPLES = 50
# The context length the mock agents report: requests past it get a 400.
MAX_MODEL_LEN = 2048
# A bound on the whole run (it takes a few seconds), so a hang fails.
TIMEOUT_S = 120
HOOKS = Path(__file__).with_name("gateway_fuzz_hooks.py")
ST = Path(sys.executable).with_name("st")


@pytest.fixture(scope="module")
def gateway():
    g = MockGateway(workers=2, max_model_len=MAX_MODEL_LEN)
    yield g
    g.shutdown()


def _calls(path: Path) -> dict[str, Counter]:
    """Statuses answered, per operation."""
    per_op: dict[str, Counter] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        op, status = json.loads(line)
        per_op[op][status] += 1
    return per_op


def test_schemathesis_finds_no_server_error_nor_schema_violation(gateway, tmp_path, capsys):
    report, calls = tmp_path / "report.json", tmp_path / "calls.jsonl"
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": str(HOOKS),
        "TIERTP_FUZZ_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        "TIERTP_FUZZ_CALLS": str(calls),
    }
    cmd = [
        str(ST), "run", f"http://{gateway.address}/openapi.json",
        "--checks", "all",
        "--max-examples", str(MAX_EXAMPLES),
        "--generation-deterministic",
        "--header", f"Authorization: Bearer {gateway.api_key}",
        "--report", "json", "--report-json-path", str(report),
        "--no-color",
    ]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    summary = json.loads(report.read_text())
    per_op = _calls(calls)
    failures = {f"{f['code']} {f['title']}": f["count"] for f in summary["failures"]}
    lines = [f"schemathesis {summary['schemathesis_version']}: {summary['test_cases']['generated']} cases "
             f"in {summary['running_time']:.1f} s, {len(failures)} kinds of failure {failures}"]
    lines += [f"  {op}: {sum(st.values())} calls, statuses {dict(sorted(st.items()))}"
              for op, st in sorted(per_op.items())]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert summary["operations"]["tested"] == summary["operations"]["total"] >= 6, summary["operations"]
    assert set(per_op) >= {"POST /v1/completions", "POST /v1/chat/completions"}, per_op
    assert not any(status >= 500 for st in per_op.values() for status in st), per_op
    assert proc.returncode == 0 and not failures and not summary["errors"], proc.stdout[-12000:]
