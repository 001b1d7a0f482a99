"""tiertp.engine.rank_processes.run_rank_processes: one process per rank, failures named;
tiertp.engine.isolated's target names."""

from __future__ import annotations

import os

import pytest
from sglang_generate import generate_text

from tiertp.engine.isolated import _importable_name
from tiertp.engine.rank_processes import run_rank_processes


def test_all_ranks_succeeding_returns():
    run_rank_processes(os._exit, [(0,), (0,)], "TP2 check", "cpu")


def test_failed_ranks_are_named_with_their_exit_codes():
    with pytest.raises(RuntimeError, match=r"TP4 check: rank processes failed \(rank, exit code\): \[\(1, 3\), \(3, 5\)\]"):
        run_rank_processes(os._exit, [(0,), (3,), (0,), (5,)], "TP4 check", "cpu")


def test_isolated_targets_are_functions_the_child_can_import():
    assert _importable_name(generate_text) == "sglang_generate:generate_text"
    for bad in (lambda payload: payload, "sglang_generate:generate_text", print.__call__):
        with pytest.raises(ValueError, match="module-level function"):
            _importable_name(bad)
