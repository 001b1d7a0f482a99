"""bench/robustness.toml: every setting loads, names tier files the planner
reads and tiers its fractions cover, and every model config composes a
profile the planner loads for the GPU it is run on; a short run of a
composed-profile setting replays on that profile (real simulator), and
`--verdict` judges it where it was written."""

from __future__ import annotations

import json

import pytest

from tiertp import _scheduler as s
from tiertp.commands.replay import compose_profile, preset_args
from tiertp.data import data_path
from tiertp.replay import presets
from tiertp.traces import parse_fractions

from test_bench_presets import cli_args

GRID = presets.BENCH_DIR / "robustness.toml"


def needs_data(what: str) -> None:
    try:
        data_path(what)
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_every_setting_loads_with_tiers_its_fractions_name():
    grid = presets.load_presets(GRID)
    assert len(grid) >= 40
    for name, preset in grid.items():
        a = preset.args
        tiers = [t["name"] for t in s.TierSet.load(a["tiers"]).to_list()]
        if a["tier_fractions"]:
            assert set(parse_fractions(a["tier_fractions"])) <= set(tiers), name
        assert (a["model"] is None) != (a["config"] is None), name
    # the grid goes beyond the paper's: other models (composed), GPUs, sizes
    assert {p.args["gpu"] for p in grid.values()} == {"a100", "h100", "h200"}
    assert sum(p.args["config"] is not None for p in grid.values()) >= 5
    assert {p.args["gpus"] for p in grid.values()} >= {2, 3, 4, 6, 8, 12, 16}


def test_every_model_config_composes_a_profile_the_planner_loads(tmp_path):
    needs_data("gpu-kernels")
    grid = presets.load_presets(GRID).values()
    for config, gpu in sorted({(p.args["config"], p.args["gpu"]) for p in grid if p.args["config"]}):
        preset = next(p for p in grid if (p.args["config"], p.args["gpu"]) == (config, gpu))
        a = compose_profile(preset_args(cli_args(out=tmp_path / preset.name, presets=GRID), preset, many=False))
        assert (a.gpu, a.model) == (None, None)
        profile = s.Profile.load(a.profile)
        assert profile.tp_levels, (config, gpu)


def test_a_short_run_of_a_composed_setting_replays_on_its_profile(tmp_path, capsys):
    from tiertp.cli import main

    if not hasattr(s, "simulate"):
        pytest.skip("this build of tiertp._scheduler has no simulator")
    needs_data("gpu-kernels")
    needs_data("traces")
    out = tmp_path / "r"
    rc = main(["replay", "--presets", str(GRID), "--preset", "q32b-a100x8-3t", "--duration", "10", "--rps", "3",
               "--policies", "tiertp,sglang", "--out", str(out), "--no-plots", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "report.json").read_text())
    assert doc["profile"].startswith("a100_sxm/qwen2.5-32b") and doc["gpus"] == 8
    assert [t["name"] for t in doc["tiers"]] == ["chat", "agent", "batch"]
    assert (out / "profile-qwen2.5-32b-a100.json").is_file()
    capsys.readouterr()
    # the preset's report judged where the preset wrote it
    assert main(["replay", "--presets", str(GRID), "--preset", "q32b-a100x8-3t", "--out", str(out), "--verdict"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("setting ") and "\nr        3 " in text and "1 load; tiertp's goodput summed" in text
