"""`tiertp fidelity` end to end against the fake OpenAI server of
test_replay_live_client (no SGLang): the simulator runs on a given profile,
the live side on the fake server, and fidelity.json compares them. Also the
pure parts: relative errors, the simulator's profile; and --tp-levels: parsing,
validation, the profile's levels, what profile, serve and the simulator get."""

from __future__ import annotations

import json
import os
import types

import pytest
from test_replay_live_client import FakeServer, tiers_file, tokenizer_dir  # noqa: F401 - fixture

from tiertp.fidelity.compare import FIGURES, compare, rel_err, table
from tiertp.fidelity.sim_profile import sim_profile_doc
from tiertp.replay.live.caps import LengthCaps
from tiertp.replay.live.limits import Limits
from tiertp.replay.workload import TierRule
from tiertp.worker.key_file import load_key_file


def profile_doc(extra_tp: bool = False) -> dict:
    level = {
        "prefill": {"batch_tokens": [16, 1024], "batch_size": [1, 8], "latency_ms": [[5, 6], [50, 55]]},
        "decode": {"batch_size": [1, 16], "context_len": [64, 1024], "latency_ms": [[2, 3], [4, 6]]},
    }
    doc = {"format": "tiertp-profile", "version": 1, "gpu": "cpu", "model": "fake", "dtype": "float32",
           "tp_levels": {"1": level}}
    if extra_tp:
        doc["tp_levels"]["2"] = json.loads(json.dumps(level))
    return doc


def test_rel_err():
    assert rel_err(1.1, 1.0) == pytest.approx(0.1)
    assert rel_err(None, 1.0) is None and rel_err(1.0, 0.0) is None and rel_err(1.0, None) is None


def test_sim_profile_keeps_live_tp_levels_and_sets_kv_and_overhead():
    doc = sim_profile_doc(profile_doc(extra_tp=True), 4096, [1], iteration_overhead_ms=10)
    assert list(doc["tp_levels"]) == ["1"]
    level = doc["tp_levels"]["1"]
    assert level["kv_capacity_tokens"] == 4096
    assert level["decode"]["latency_ms"] == [[12, 13], [14, 16]]
    assert doc["provenance"]["fidelity"]["iteration_overhead_ms"] == 10
    with pytest.raises(ValueError, match="missing"):
        sim_profile_doc(profile_doc(), 4096, [1, 2])


def test_fidelity_compares_simulated_and_live_runs(tmp_path, tokenizer_dir):  # noqa: F811
    from tiertp.fidelity.experiment import FidelityConfig, run_fidelity

    # One request in 7 fails: every load (8 requests or more) holds a failure, however many
    # requests the probes sent before it.
    server = FakeServer(lambda n, b: "http429" if n % 7 == 4 else "ok")
    try:
        profile = tmp_path / "profile.json"
        profile.write_text(json.dumps(profile_doc()))
        cfg = FidelityConfig(
            traces=["synthetic:poisson,rate=20,prompt=50,output=6,duration=5,seed=1"], rps=[4.0, 8.0],
            duration_s=2.0, out=tmp_path / "fid", tiers_path=tiers_file(tmp_path),
            tier_rule=TierRule(fractions={"chat": 0.5, "agent": 0.5}), caps=LengthCaps(40, 4),
            limits=Limits(first_token_s=3, stall_s=3, total_s=10), profile=profile, url=server.url,
            tokenizer=str(tokenizer_dir), sim_policies=["tiertp", "sglang"], cooldown_s=0, progress=False,
            command_line=["tiertp", "fidelity", "..."])
        report = run_fidelity(cfg)
    finally:
        server.stop()
    doc = json.loads((cfg.out / "fidelity.json").read_text())
    assert doc["simulator"]["gpus"] == 2 and doc["simulator"]["tp_levels"] == [1]
    assert doc["simulator"]["kv_capacity_tokens_per_device"] > 0
    assert doc["length_caps"] == {"max_prompt_tokens": 40, "max_output_tokens": 4}
    probe = doc["unloaded_probe"]["tiers"]
    assert set(probe) == {"chat", "agent"}
    assert probe["chat"]["measured"]["ttft_ms"] > 0 and probe["chat"]["predicted"]["ttft_ms"] > 0
    # each tier at its own median prompt (all capped at 40 tokens here), then a quarter of it
    assert probe["agent"]["prompt_tokens"] == 40
    assert doc["unloaded_probe"]["second_length"]["tiers"]["agent"]["prompt_tokens"] == 10
    assert [round(x["offered_rps"]) for x in doc["loads"]] == [4, 8]
    for load in doc["loads"]:
        assert load["live"]["completed"] + load["live"]["failed"] == load["requests"]
        assert load["live"]["failed"] >= 1
        rows = load["comparison"]["tiertp"]
        assert [r["tier"] for r in rows] == ["all", "chat", "agent"]
        assert set(FIGURES) <= set(rows[0])
        assert rows[0]["goodput_rps"]["measured"] is not None and rows[0]["goodput_rps"]["predicted"] is not None
    sim_profile = json.loads((cfg.out / "profile-sim.json").read_text())
    assert sim_profile["tp_levels"]["1"]["kv_capacity_tokens"] > 0
    rep = json.loads((cfg.out / "report.json").read_text())
    assert set(rep["loads"][0]["policies"]) == {"tiertp", "sglang", "tiertp-calibrated", "live"}
    # the calibrated prediction scales prefill cells by the probe's measured/predicted TTFT, decode
    # cells by its TPOT
    scale = doc["calibration"]["scale"]
    assert scale["prefill"] > 0 and scale["decode"] > 0
    calibrated = json.loads((cfg.out / "profile-sim-calibrated.json").read_text())
    assert calibrated["provenance"]["fidelity"]["scale"] == pytest.approx(scale)
    assert "simulated tiertp vs measured" in report.text
    assert (cfg.out / "goodput.png").stat().st_size > 0


def test_table_shows_predicted_measured_and_error():
    from tiertp.replay.metrics import RunMetrics, TierMetrics

    def metrics(goodput, ttft):
        pct = {"p50": ttft, "p90": ttft, "p99": ttft}
        t = TierMetrics("chat", 10, 10, 0, 8, 0.8, goodput, pct, pct)
        return RunMetrics(10, 10, 0, 8, 0.8, goodput, 1.0, 10.0, [t])

    rows = compare(metrics(1.1, 200.0), metrics(1.0, 100.0))
    assert rows[1]["ttft_p50_ms"]["rel_err"] == pytest.approx(1.0)
    text = table(rows)
    assert "1.10/1.00 (+10%)" in text and "200/100 (+100%)" in text


# ---- --tp-levels: parsing, the profile's levels, what serve and the simulator get ----------------

FAKE_TRACE = "synthetic:poisson,rate=20,prompt=50,output=6,duration=5,seed=1"


def fake_serve_process(server, tmp_path, started: list):
    """A stand-in for ServeProcess that serves `server` and records each
    start's (args, keywords) in `started`."""

    class FakeServe:
        def __init__(self, *args, **kw):
            started.append((args, kw))
            self.agent_endpoint = None  # no agent to ask: the live agent counts are None
            self.output_path = tmp_path / "serve.log"

        def wait_url(self):
            return server.url

        def alive(self):
            return True

        def stop(self):
            return 0

    return FakeServe


def _fidelity_cli(monkeypatch, tmp_path, *extra: str):
    """Run `tiertp fidelity ... extra` with run_fidelity replaced: (exit code, the FidelityConfig or None)."""
    from tiertp import cli
    from tiertp.fidelity import experiment

    seen = {}

    def fake_run(cfg):
        seen["cfg"] = cfg
        return experiment.FidelityReport({"aborted": None, "loads": []}, "", [])

    monkeypatch.setattr(experiment, "run_fidelity", fake_run)
    code = cli.main(["fidelity", "--trace", FAKE_TRACE, "--rps", "1", "--duration", "2",
                     "--out", str(tmp_path / "fid"), *extra])
    return code, seen.get("cfg")


def test_tp_levels_option_is_parsed_checked_and_passed_on(monkeypatch, tmp_path, capsys):
    profile = tmp_path / "profile-1-2.json"
    profile.write_text(json.dumps(profile_doc(extra_tp=True)))
    code, cfg = _fidelity_cli(monkeypatch, tmp_path, "--model", "tiny-llama", "--devices", "2",
                              "--tp-levels", "2,1", "--profile", str(profile))
    assert code == 0 and cfg.tp_levels == (1, 2) and cfg.levels() == [1, 2]
    # default: today's behaviour, the worker's levels (TP 1)
    code, cfg = _fidelity_cli(monkeypatch, tmp_path, "--profile", str(profile))
    assert code == 0 and cfg.tp_levels is None and cfg.levels() == [1]


@pytest.mark.parametrize("extra, message", [
    (["--model", "tiny-llama", "--devices", "2", "--tp-levels", "1,4"], "needs at least that many devices"),
    (["--model", "tiny-llama", "--devices", "4", "--tp-levels", "1,3"], "powers of two"),
    (["--model", "tiny-llama", "--devices", "2", "--tp-levels", "2"], "must include 1"),
    (["--model", "smollm2-135m", "--devices", "2", "--tp-levels", "1,2"], "9 attention heads"),
])
def test_tp_levels_are_validated_before_anything_starts(monkeypatch, tmp_path, capsys, extra, message):
    code, cfg = _fidelity_cli(monkeypatch, tmp_path, *extra)
    assert code == 2 and cfg is None
    assert message in capsys.readouterr().err


def test_a_profile_without_every_level_is_refused_naming_the_missing_ones(monkeypatch, tmp_path, capsys):
    profile = tmp_path / "profile-1.json"
    profile.write_text(json.dumps(profile_doc()))
    code, cfg = _fidelity_cli(monkeypatch, tmp_path, "--model", "tiny-llama", "--devices", "2",
                              "--tp-levels", "1,2", "--profile", str(profile))
    assert code == 2 and cfg is None
    err = capsys.readouterr().err
    assert "missing TP level(s) [2]" in err and str(profile) in err


def test_serve_process_is_started_with_the_tp_levels_and_a_known_agent_port(monkeypatch, tmp_path):
    from tiertp.fidelity import serve_process

    class Popen:
        def __init__(self, cmd, **kw):
            self.cmd, self.stdout, self.returncode = cmd, iter([]), 0

        def poll(self):
            return 0

    monkeypatch.setattr(serve_process.subprocess, "Popen", Popen)
    sp = serve_process.ServeProcess("tiny-llama", 2, tmp_path / "tiers.toml", tmp_path / "logs",
                                    tp_levels=[1, 2], worker_port=7123)
    cmd = sp.cmd
    assert cmd[cmd.index("--tp-levels") + 1] == "1,2" and cmd[cmd.index("--worker-port") + 1] == "7123"
    assert sp.agent_endpoint == "tcp://127.0.0.1:7123"
    # The agent's key, to ask it: written where serve reads it, owner-only.
    key_file = cmd[cmd.index("--key-file") + 1]
    assert load_key_file(key_file).raw == sp.agent_key.raw and os.stat(key_file).st_mode & 0o777 == 0o600
    sp.stop()
    plain = serve_process.ServeProcess("smollm2-135m", 2, tmp_path / "tiers.toml", tmp_path / "logs2")
    assert "--tp-levels" not in plain.cmd and "--key-file" not in plain.cmd and plain.agent_endpoint is None
    plain.stop()


def test_fidelity_profiles_serves_and_simulates_the_same_tp_levels(monkeypatch, tmp_path, tokenizer_dir):  # noqa: F811
    """The wiring end to end, with `tiertp profile` and `tiertp serve` faked: the
    profile is measured at --tp-levels, serve gets them, the simulator's profile
    has exactly them, and fidelity.json reports each side's moves."""
    from tiertp.fidelity import experiment

    server = FakeServer(lambda n, b: "ok")
    profiled, served = [], []

    def fake_profile(cmd, check):
        profiled.append(cmd)
        doc = profile_doc(extra_tp=True)
        doc["tp_levels"]["4"] = json.loads(json.dumps(doc["tp_levels"]["1"]))
        open(cmd[cmd.index("--out") + 1], "w").write(json.dumps(doc))

    monkeypatch.setattr(experiment, "subprocess", types.SimpleNamespace(run=fake_profile))
    monkeypatch.setattr(experiment, "ServeProcess", fake_serve_process(server, tmp_path, served))
    try:
        cfg = experiment.FidelityConfig(
            traces=[FAKE_TRACE], rps=[4.0], duration_s=2.0, out=tmp_path / "fid", tiers_path=tiers_file(tmp_path),
            tier_rule=TierRule(fractions={"chat": 0.5, "agent": 0.5}), caps=LengthCaps(40, 4),
            limits=Limits(first_token_s=3, stall_s=3, total_s=10), model="tiny-llama", devices=2, tp_levels=(1, 2),
            tokenizer=str(tokenizer_dir), cooldown_s=0, probe_per_tier=0, progress=False, plots=False)
        report = experiment.run_fidelity(cfg)
    finally:
        server.stop()
    cmd = profiled[0]
    assert cmd[cmd.index("--tp") + 1] == "1,2" and "tiny-llama" in cmd
    (model, devices, _tiers, _logs), kw = served[0]
    assert (model, devices, kw["tp_levels"]) == ("tiny-llama", 2, [1, 2])
    assert kw["profile"] == cfg.out / "profile-sim.json" and kw["worker_port"] > 0
    sim_profile = json.loads((cfg.out / "profile-sim.json").read_text())
    assert sorted(sim_profile["tp_levels"]) == ["1", "2"]  # the measured TP4 table is cut
    doc = json.loads((cfg.out / "fidelity.json").read_text())
    assert doc["tp_levels"] == [1, 2] and doc["simulator"]["tp_levels"] == [1, 2]
    moves = doc["loads"][0]["moves"]
    sim = moves["simulated"]["tiertp"]
    assert sim["switches"] >= 0 and set(sim["tp_levels_planned"]) <= {1, 2}
    assert moves["live"]["agent"] is None
    assert moves["live"]["gateway_plans"]["tp_levels_planned"] == [1]  # the fake server's plan
    assert "moves, live:" in report.text


def test_timeline_summary_counts_tp_layout_changes_and_prefill_time():
    from tiertp.fidelity.moves import timeline_summary

    tp1 = [{"tier": "chat", "role": "colocated", "tp": 1, "first_gpu": 0},
           {"tier": "agent", "role": "colocated", "tp": 1, "first_gpu": 1}]
    tp2 = [{"tier": "chat", "role": "colocated", "tp": 2, "first_gpu": 0}]
    pd = [{"tier": "chat", "role": "prefill", "tp": 1, "first_gpu": 0},
          {"tier": "chat", "role": "decode", "tp": 1, "first_gpu": 1}]
    s = timeline_summary([{"time_s": 0.0, "groups": tp1}, {"time_s": 10.0, "groups": tp2},
                          {"time_s": 20.0, "groups": pd}, {"time_s": 25.0, "groups": tp1}], end_s=30.0)
    assert s["tp_layout_changes"] == 2 and s["group_changes"] == 3  # pd has tp1's layout, not its groups
    assert s["tp_levels_planned"] == [1, 2] and s["max_tp_planned"] == 2
    assert s["prefill_decode_planned_s"] == 5.0 and "prefill" in s["roles_planned"]


def test_agent_moves_asks_the_agent_for_its_counters():
    import threading

    import zmq

    from tiertp.fidelity.moves import agent_moves, moves_delta
    from tiertp.worker import protocol as P
    from tiertp.worker.gate import Gate
    from tiertp.worker.seal import ControlKey

    key = ControlKey.generate()
    gate = Gate(key)  # the agent's
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def answer():
        client, frame = router.recv_multipart()
        assert P.decode(gate.open(client, [frame], "the test"))["type"] == P.STATS
        router.send_multipart([client, gate.seal(client, P.encode({
            "type": P.STATS, "devices": [], "plan_id": 3, "processes": [],
            "moves": {"switches": 2, "rolled_back": 0, "hand_offs": 5, "handed_off_requests": 5}}))])

    t = threading.Thread(target=answer)
    t.start()
    try:
        got = agent_moves(f"tcp://127.0.0.1:{port}", key, timeout_s=5)
    finally:
        t.join(5)
        router.close(0)
        ctx.term()
    assert got == {"switches": 2, "rolled_back": 0, "hand_offs": 5, "handed_off_requests": 5}
    assert moves_delta({"switches": 1, "rolled_back": 0, "hand_offs": 1, "handed_off_requests": 2}, got) == \
        {"switches": 1, "rolled_back": 0, "hand_offs": 4, "handed_off_requests": 3}
    assert moves_delta(None, got) is None
