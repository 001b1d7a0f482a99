"""A number outside its option's range is a usage error naming the option,
before anything runs (not a traceback or a failure deep in the planner)."""

from __future__ import annotations

import pytest

from tiertp.cli import main

REPLAY = ["replay", "--trace", "azure-conv", "--rps", "1", "--duration", "5", "--no-plots", "--no-progress"]


@pytest.mark.parametrize("argv,option,expected", [
    (["demo", "--gpus", "-3"], "--gpus", "a whole number >= 1"),
    (["plan", "--gpus", "0"], "--gpus", "a whole number >= 1"),
    (["plan", "--gpus-per-node", "0"], "--gpus-per-node", "a whole number >= 1"),
    (["plan", "--gpus", "two"], "--gpus", "a whole number >= 1"),
    ([*REPLAY, "--window", "0"], "--window", "a number > 0"),
    ([*REPLAY, "--kv-gbps", "nan"], "--kv-gbps", "a number > 0"),
    ([*REPLAY, "--switch-ms", "-1"], "--switch-ms", "a number >= 0"),
    ([*REPLAY, "--duration", "0"], "--duration", "a number > 0"),
    (["replay", "--trace", "azure-conv", "--rps", "1,inf", "--duration", "5"], "--rps", "numbers > 0"),
    (["serve", "--window", "-1"], "--window", "a number > 0"),
    (["profile", "--out", "p.json", "--level-timeout", "0"], "--level-timeout", "a number > 0"),
    (["profile", "--out", "p.json", "--cores-per-rank", "0"], "--cores-per-rank", "a whole number >= 1"),
    (["fidelity", "--devices", "0", "--trace", "azure-conv", "--rps", "1", "--duration", "5"], "--devices",
     "a whole number >= 1"),
])
def test_out_of_range_numbers_are_usage_errors(argv, option, expected, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: expected {expected}" in err, err

