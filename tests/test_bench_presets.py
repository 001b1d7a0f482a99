"""bench/presets.toml and `tiertp replay --preset`: the shipped presets name
real profiles and the Table 1 tier files, unknown names fail listing the
valid ones, flags override a preset, and a short preset run writes its
report (real simulator, 10 s of the Azure traces at one load)."""

from __future__ import annotations

import argparse
import json

import pytest

from tiertp import _scheduler as s
from tiertp.commands.replay import DEFAULTS, preset_args
from tiertp.replay import presets
from tiertp.replay.presets import load_presets, select

SHIPPED = {
    "8b-a100x4": ("llama-3.1-8b", "a100", 4, [5, 10, 20, 40, 70]),
    "8b-h100x4": ("llama-3.1-8b", "h100", 4, [5, 10, 20, 40, 70]),
    "8b-h100x8": ("llama-3.1-8b", "h100", 8, [10, 20, 40, 70, 100, 150]),
    "14b-h100x8": ("qwen2.5-14b", "h100", 8, [10, 20, 40, 70, 100]),
}
# EVALUATION.md Table 1: (chat TTFT, TPOT), (agent TTFT, TPOT) in ms
TABLE_1 = {
    "8b-a100x4": ((500, 15), (500, 30)),
    "8b-h100x4": ((300, 10), (300, 20)),
    "8b-h100x8": ((300, 10), (300, 20)),
    "14b-h100x8": ((200, 10), (200, 15)),
}


def test_shipped_presets_are_the_papers_settings():
    from tiertp.profiles import resolve

    shipped = load_presets()
    assert list(shipped) == list(SHIPPED)
    for name, (model, gpu, gpus, rps) in SHIPPED.items():
        a = shipped[name].args
        assert (a["model"], a["gpu"], a["gpus"], a["rps"]) == (model, gpu, gpus, rps)
        assert (a["trace"], a["duration"], a["policies"]) == (["azure-conv", "azure-code"], 600.0, "all")
        assert resolve(a["gpu"], a["model"]).is_file()
        tiers = {t["name"]: (t["ttft_ms"], t["tpot_ms"]) for t in s.TierSet.load(a["tiers"]).to_list()}
        assert tiers == dict(zip(("chat", "agent"), TABLE_1[name]))


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown preset 'gold'; valid: all, 8b-a100x4, 8b-h100x4, 8b-h100x8, 14b-h100x8"):
        select("gold")
    assert [p.name for p in select("all")] == list(SHIPPED)


def write(tmp_path, text: str):
    (tmp_path / "t.toml").write_text('[[tier]]\nname = "chat"\nttft_ms = 1\ntpot_ms = 1\n')
    path = tmp_path / "presets.toml"
    path.write_text(text)
    return path


GOOD = """
[defaults]
traces = ["azure-conv"]
duration = 60
policies = "all"

[preset.small]
model = "llama-3.1-8b"
gpu = "h100"
gpus = 2
tiers = "t.toml"
rps = [1, 2.5]

[preset.other]
model = "qwen2.5-14b"
gpu = "h100"
gpus = 8
tiers = "t.toml"
rps = [10]
policies = "tiertp"
"""


def test_a_preset_file_is_checked(tmp_path):
    (small, other) = load_presets(write(tmp_path, GOOD)).values()
    assert small.args["tiers"] == str(tmp_path / "t.toml") and small.args["rps"] == [1.0, 2.5]
    assert (small.args["policies"], other.args["policies"]) == ("all", "tiertp")  # a preset's own value wins
    with pytest.raises(ValueError, match="unknown key\\(s\\) \\['gpu_count'\\]; valid: gpu, model"):
        load_presets(write(tmp_path, GOOD + "gpu_count = 3\n"))
    with pytest.raises(ValueError, match="missing \\['rps'\\]"):
        load_presets(write(tmp_path, GOOD.replace("rps = [10]\n", "")))
    with pytest.raises(ValueError, match="rps must be a list of numbers > 0"):
        load_presets(write(tmp_path, GOOD.replace("rps = [10]", "rps = [0]")))
    with pytest.raises(ValueError, match="tier file .*nope.toml does not exist"):
        load_presets(write(tmp_path, GOOD.replace('tiers = "t.toml"\nrps = [10]', 'tiers = "nope.toml"\nrps = [10]')))
    with pytest.raises(FileNotFoundError, match="source checkout"):
        load_presets(tmp_path / "absent.toml")
    with pytest.raises(ValueError, match="preset 'other': give the model as exactly one of `model`"):
        load_presets(write(tmp_path, GOOD + 'config = "t.toml"\n'))
    with pytest.raises(ValueError, match="preset 'other': model config .*absent.json does not exist"):
        load_presets(write(tmp_path, GOOD.replace('model = "qwen2.5-14b"', 'config = "absent.json"')))
    with pytest.raises(ValueError, match="preset 'other': tier fractions 'chat=0.7' sum to 0.7, not 1"):
        load_presets(write(tmp_path, GOOD + 'tier_fractions = "chat=0.7"\n'))


def cli_args(**given) -> argparse.Namespace:
    """What the replay parser leaves for the preset's arguments when no flag is given."""
    base = dict(trace=[], tiers=None, gpus=None, policies=None, rps=None, duration=None, gpu=None, model=None,
                tier_fractions=None, profile=None, out=None, presets=presets.PRESETS_FILE)
    return argparse.Namespace(**{**base, **given})


def test_flags_override_the_preset(tmp_path):
    (preset,) = select("8b-h100x8")
    a = preset_args(cli_args(), preset, many=False)
    assert (a.gpus, a.rps, a.duration, a.model) == (8, [10.0, 20.0, 40.0, 70.0, 100.0, 150.0], 600.0, "llama-3.1-8b")
    assert a.out == presets.RESULTS_DIR / "8b-h100x8"
    a = preset_args(cli_args(duration=30.0, rps=[70.0], gpus=4, trace=["azure-conv"], out=tmp_path), preset, many=False)
    assert (a.duration, a.rps, a.gpus, a.trace, a.out) == (30.0, [70.0], 4, ["azure-conv"], tmp_path)
    assert preset_args(cli_args(out=tmp_path), preset, many=True).out == tmp_path / "8b-h100x8"
    # --profile replaces the preset's shipped table instead of clashing with it
    a = preset_args(cli_args(profile="synthetic"), preset, many=False)
    assert (a.profile, a.gpu, a.model) == ("synthetic", None, None)
    # --model replaces a preset's config.json (the profile composed from it)
    composed = presets.Preset("c", {**preset.args, "model": None, "config": "/m/config.json"})
    a = preset_args(cli_args(model="qwen2.5-14b"), composed, many=False)
    assert (a.model, a.config) == ("qwen2.5-14b", None)
    assert preset_args(cli_args(), composed, many=False).config == "/m/config.json"
    # the preset's values beat the built-in defaults
    (small,) = select("8b-a100x4")
    a = preset_args(cli_args(), small, many=False)
    assert a.gpus == 4 != DEFAULTS["gpus"] and a.tiers.endswith("bench/tiers/llama-3.1-8b-a100.toml")


def test_a_short_preset_run_and_its_ablation(tmp_path, capsys):
    from tiertp.cli import main

    from tiertp.data import data_path

    if not hasattr(s, "simulate"):
        pytest.skip("this build of tiertp._scheduler has no simulator")
    try:
        data_path("traces")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    out = tmp_path / "r"
    rc = main(["replay", "--preset", "14b-h100x8", "--duration", "10", "--rps", "70", "--policies", "tiertp,sglang",
               "--out", str(out), "--no-plots", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "report.json").read_text())
    assert doc["gpus"] == 8 and doc["profile"].startswith("h100_sxm/qwen2.5-14b") and doc["duration_s"] == 10.0
    assert doc["tiers_file"].endswith("bench/tiers/qwen2.5-14b-h100.toml")
    assert [x["rps"] for x in doc["loads"]] == [70.0]
    assert all(isinstance(e["fair"], bool) for e in doc["loads"][0]["policies"].values())
    capsys.readouterr()
    assert main(["replay", "--ablation", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ablation at 70 req/s" in text and "sglang (tp=1)" in text and "not run" in text
