"""`tiertp serve`'s default profile: this machine's, measured once with the
quick grid at the worker's TP levels and cores per device, then cached by
model, device and TP levels. The measurement is faked here (it writes a valid
profile); tests/test_profiling_cpu.py runs the real one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from argparse import Namespace

import pytest

from tiertp import _scheduler
from tiertp.commands import serve
from tiertp.commands.gateway_options import gateway_settings
from tiertp.profile_source import MEASURED
from tiertp.profiling.grid import grid_for
from tiertp.profiling.machine_profile import machine_profile
from tiertp.profiling.run_profile import ProfileRequest


def _profile_json(levels: list[int]) -> str:
    doc = json.loads(_scheduler.Profile.synthetic().to_json())
    doc["tp_levels"] = {str(t): doc["tp_levels"][str(t)] for t in levels}
    return json.dumps(doc)


class FakeMeasure:
    """Writes a valid profile of the requested levels where `tiertp profile` would."""

    def __init__(self, levels: list[int] | None = None, delay_s: float = 0.0):
        self.requests: list[ProfileRequest] = []
        self.levels, self.delay_s = levels, delay_s

    def __call__(self, req: ProfileRequest) -> None:
        self.requests.append(req)
        time.sleep(self.delay_s)
        req.out.write_text(_profile_json(self.levels or req.tp_levels))


def test_measured_once_with_the_quick_grid_and_the_workers_cores_then_cached(tmp_path):
    measure, said = FakeMeasure(), []
    first = machine_profile("tiny-llama", "cpu", [2, 1], 2, root=tmp_path, measure=measure, announce=said.append)
    [req] = measure.requests
    assert (req.model, req.device, req.tp_levels, req.quick, req.cores_per_rank, req.out) == (
        "tiny-llama", "cpu", [1, 2], True, 2, first)
    assert len(said) == 1 and "measuring this machine's profile of tiny-llama" in said[0]
    assert "--profile synthetic" in said[0]
    assert first.is_relative_to(tmp_path / "profiles" / "tiny-llama" / "cpu-2core")
    assert _scheduler.Profile.load(str(first)).tp_levels == [1, 2]

    again = machine_profile("tiny-llama", "cpu", [1, 2], 2, root=tmp_path, measure=measure, announce=said.append)
    assert again == first and len(measure.requests) == 1 and len(said) == 1


def test_the_key_is_model_device_cores_and_tp_levels(tmp_path):
    measure = FakeMeasure()
    paths = {machine_profile(m, "cpu", levels, cores, root=tmp_path, measure=measure, announce=lambda _: None)
             for m, levels, cores in [("tiny-llama", [1], 1), ("tiny-llama", [1], 2), ("tiny-llama", [1, 2], 1),
                                      ("smollm2-135m", [1], 1)]}
    assert len(paths) == 4 and len(measure.requests) == 4


def test_the_grid_is_part_of_the_key(tmp_path, monkeypatch):
    from tiertp.profiling import grid

    measure = FakeMeasure()
    before = machine_profile("tiny-llama", "cpu", [1], 1, root=tmp_path, measure=measure, announce=lambda _: None)
    quick = grid_for("cpu", True)
    changed = grid.Grid(**{**quick.to_dict(), "repeats": quick.repeats + 1})
    monkeypatch.setitem(grid.GRIDS, ("cpu", True), changed)
    after = machine_profile("tiny-llama", "cpu", [1], 1, root=tmp_path, measure=measure, announce=lambda _: None)
    assert after != before and len(measure.requests) == 2


@pytest.mark.parametrize("damage", ["corrupt", "missing_level"])
def test_a_cached_file_the_planner_cannot_use_is_measured_again(tmp_path, caplog, damage):
    measure = FakeMeasure()
    path = machine_profile("tiny-llama", "cpu", [1, 2], 1, root=tmp_path, measure=measure, announce=lambda _: None)
    path.write_text("{not json" if damage == "corrupt" else _profile_json([1]))
    with caplog.at_level(logging.WARNING):
        again = machine_profile("tiny-llama", "cpu", [1, 2], 1, root=tmp_path, measure=measure,
                                announce=lambda _: None)
    assert again == path and len(measure.requests) == 2
    assert _scheduler.Profile.load(str(path)).tp_levels == [1, 2]
    if damage == "corrupt":
        assert caplog.text.count("does not load") == 1 and str(path) in caplog.text


def test_a_measurement_that_writes_nothing_usable_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="no usable"):
        machine_profile("tiny-llama", "cpu", [1, 2], 1, root=tmp_path, measure=FakeMeasure(levels=[1]),
                        announce=lambda _: None)


def test_two_serves_starting_at_once_measure_once(tmp_path):
    measure = FakeMeasure(delay_s=0.3)
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(
        machine_profile("tiny-llama", "cpu", [1], 1, root=tmp_path, measure=measure, announce=lambda _: None)))
        for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(measure.requests) == 1 and len(set(out)) == 1 and len(out) == 3


def _serve_args(**kw) -> Namespace:
    args = dict(model="tiny-llama", tp_levels=[1, 2], tiers=None, profile=MEASURED, window=None,
                sampling_defaults="model", host="127.0.0.1", port=0)
    return Namespace(**{**args, **kw})


def test_serve_plans_with_the_cached_profile_of_its_cores_per_device(tmp_path, monkeypatch):
    """serve's default resolves to this machine's cached profile, measured with
    the cores the agent gives each device (serve passes its AgentConfig's)."""
    import tiertp.profiling.machine_profile as mp

    settings = gateway_settings(_serve_args())  # before the cache moves: the model is built there
    assert settings.profile == MEASURED and settings.profile_path is None
    monkeypatch.setenv("TIERTP_CACHE", str(tmp_path))
    measure = FakeMeasure()
    monkeypatch.setattr(mp, "_measure", measure)
    resolved = serve._with_machine_profile(settings, "tiny-llama", cores_per_device=3)
    [req] = measure.requests
    assert req.cores_per_rank == 3 and req.tp_levels == [1, 2]
    assert resolved.profile == resolved.profile_path == str(req.out)
    assert req.out.is_relative_to(tmp_path / "profiles")


def test_serve_defaults_to_the_measured_profile_and_the_gateway_refuses_it(tmp_path):
    from tiertp.worker.key_file import write_key_file

    write_key_file(tmp_path / "k")
    help_text = subprocess.run([sys.executable, "-m", "tiertp.cli", "serve", "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert "(default: measured)" in " ".join(help_text.split())
    r = subprocess.run([sys.executable, "-m", "tiertp.cli", "gateway", "--worker", "tcp://127.0.0.1:9=1",
                        "--key-file", str(tmp_path / "k"), "--profile", MEASURED], capture_output=True, text=True)
    assert r.returncode == 2
    assert "--profile measured: the gateway has no devices of its own" in r.stderr, r.stderr
