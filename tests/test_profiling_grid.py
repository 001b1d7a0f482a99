"""tiertp.profiling without the engine: grids, checkpoint/resume, the writer."""

from __future__ import annotations

import json

import pytest

from tiertp.profiling import checkpoint, grid, writer
from tiertp.profiling.checkpoint import CheckpointMismatch, Progress, open_checkpoint
from tiertp.profiling.grid import DECODE, PREFILL, Cell, Grid

SMALL = Grid(
    prefill_batch_tokens=(2, 8),
    prefill_batch_size=(1, 4),
    decode_batch_size=(1, 2),
    decode_context_len=(16,),
    warmup=0,
    repeats=1,
)
RUN = {"model": "m", "grid": SMALL.to_dict()}


def test_parse_tp_list():
    assert grid.parse_tp_list("3,1") == [1, 3]
    for bad in ("", "1,,2", "0", "9", "1,1", "two"):
        with pytest.raises(ValueError, match="--tp"):
            grid.parse_tp_list(bad)


def test_tp_must_divide_heads():
    grid.check_tp_fits_model([1, 3], 9, 3, "smollm2")
    with pytest.raises(ValueError, match=r"\[2\].*9 attention heads"):
        grid.check_tp_fits_model([1, 2], 9, 3, "smollm2")


def test_infeasible_prefill_cells_are_filled_from_nearest_feasible():
    # 2 tokens over 4 prompts is impossible: filled from (2 tokens, 1 prompt)
    assert not grid.feasible(Cell(PREFILL, 2, 4))
    assert grid.nearest_feasible(Cell(PREFILL, 2, 4), SMALL) == Cell(PREFILL, 2, 1)
    assert Cell(PREFILL, 2, 4) not in grid.measured_cells(SMALL)
    assert len(grid.measured_cells(SMALL)) == 3 + 2


def test_prompt_lengths_split_evenly():
    assert grid.prompt_lengths(10, 4) == [3, 3, 2, 2]
    with pytest.raises(ValueError):
        grid.prompt_lengths(2, 4)


def test_grid_rejects_unsorted_axes():
    with pytest.raises(ValueError, match="strictly increasing"):
        Grid((8, 2), (1,), (1,), (16,), 0, 1)


def test_kv_tokens_needed_covers_decode_growth():
    # 2 requests x (16 context + 2 sizes x 1 step + 1)
    assert SMALL.kv_tokens_needed() == 2 * (16 + 2 + 1)


def test_every_device_has_both_grids():
    for device in ("cpu", "cuda"):
        for quick in (False, True):
            assert grid.grid_for(device, quick).repeats >= 1
    with pytest.raises(ValueError, match="cpu, cuda"):
        grid.grid_for("tpu", False)


def test_every_grid_measures_the_prior_requests_decode_context():
    """A plan made at start-up asks for the prior request's context: no grid
    leaves it to a clamp (which underestimates the step and warns)."""
    from tiertp._scheduler import PRIOR_OUTPUT_TOKENS, PRIOR_PROMPT_TOKENS

    for key, g in grid.GRIDS.items():
        assert max(g.decode_context_len) >= PRIOR_PROMPT_TOKENS + PRIOR_OUTPUT_TOKENS, key


def _cell(tp, table, x, y, ms=1.0):
    return {"kind": "cell", "tp": tp, "table": table, "x": x, "y": y, "latency_ms": ms, "spread_ms": 0.0}


def test_checkpoint_resumes_measured_cells(tmp_path):
    path = tmp_path / "p.json.partial.jsonl"
    assert open_checkpoint(path, RUN).cells == {}
    checkpoint.append_record(path, _cell(1, PREFILL, 2, 1))
    progress = open_checkpoint(path, RUN)
    assert progress.done(1, Cell(PREFILL, 2, 1))
    assert not progress.done(2, Cell(PREFILL, 2, 1))


def test_checkpoint_ignores_a_torn_line(tmp_path):
    path = tmp_path / "c.jsonl"
    open_checkpoint(path, RUN)
    checkpoint.append_record(path, _cell(1, PREFILL, 2, 1))
    with open(path, "a") as f:
        f.write('{"kind": "cell", "tp": 1, "tab')  # killed mid-write
    checkpoint.append_record(path, _cell(1, PREFILL, 8, 1))
    progress = open_checkpoint(path, RUN)
    assert set(progress.cells[1]) == {Cell(PREFILL, 2, 1), Cell(PREFILL, 8, 1)}


def test_checkpoint_of_another_run_is_refused_unless_restart(tmp_path):
    path = tmp_path / "c.jsonl"
    open_checkpoint(path, RUN)
    checkpoint.append_record(path, _cell(1, PREFILL, 2, 1))
    other = {**RUN, "model": "other"}
    with pytest.raises(CheckpointMismatch, match="model.*--restart"):
        open_checkpoint(path, other)
    assert open_checkpoint(path, other, restart=True).cells == {}


def _full_progress(tps):
    progress = Progress()
    for tp in tps:
        for c in grid.measured_cells(SMALL):
            progress.add(_cell(tp, c.table, c.x, c.y, ms=float(tp * 100 + c.x + c.y)))
        progress.add({"kind": "level", "tp": tp, "kv_capacity_tokens": None})
    return progress


def test_missing_cells_are_what_resume_measures():
    progress = _full_progress([1])
    assert writer.missing_cells(SMALL, [1], progress) == []
    missing = writer.missing_cells(SMALL, [1, 3], progress)
    assert len(missing) == len(grid.measured_cells(SMALL)) and all(tp == 3 for tp, _ in missing)


def _doc(tps, progress):
    return writer.build_profile(
        gpu="cpu", model="m", dtype="float32", kv_bytes_per_token=64, grid=SMALL,
        tp_levels=tps, progress=progress, provenance={"tool": "test"},
    )


def test_profile_tables_are_full_rectangles_with_fills_recorded():
    doc = _doc([1, 3], _full_progress([1, 3]))
    pre = doc["tp_levels"]["3"]["prefill"]
    assert pre["batch_tokens"] == [2.0, 8.0] and pre["batch_size"] == [1.0, 4.0]
    # row 2 tokens: the infeasible (2, 4) cell repeats (2, 1)
    assert pre["latency_ms"][0] == [303.0, 303.0]
    assert pre["latency_ms"][1] == [309.0, 312.0]
    dec = doc["tp_levels"]["1"]["decode"]
    assert len(dec["latency_ms"]) == 2 and all(len(r) == 1 for r in dec["latency_ms"])
    filled = doc["provenance"]["filled_cells"]["cells"]
    assert [(f["tp"], f["table"], f["x"], f["y"], f["from"]) for f in filled] == [
        (tp, PREFILL, 2, 4, {"x": 2, "y": 1}) for tp in (1, 3)
    ]
    assert "kv_capacity_tokens" not in doc["tp_levels"]["1"]


def test_decode_cells_beyond_the_kv_pool_take_a_dominated_measured_cell():
    progress = _full_progress([1])
    too_big = Cell(DECODE, 2, 16)
    del progress.cells[1][too_big]
    progress.add({"kind": "infeasible", "tp": 1, "table": DECODE, "x": 2, "y": 16, "reason": "exceeds the KV pool"})
    assert writer.missing_cells(SMALL, [1], progress) == []  # resume does not retry it
    doc = _doc([1], progress)
    # (bs 2, ctx 16) takes (bs 1, ctx 16): 100 + 1 + 16
    assert doc["tp_levels"]["1"]["decode"]["latency_ms"] == [[117.0], [117.0]]
    [fill] = [f for f in doc["provenance"]["filled_cells"]["cells"] if f["table"] == DECODE]
    assert fill["from"] == {"x": 1, "y": 16} and "KV pool" in fill["reason"]


def test_profile_with_unmeasured_cell_is_refused():
    progress = _full_progress([1])
    del progress.cells[1][Cell(DECODE, 2, 16)]
    with pytest.raises(writer.IncompleteProfile, match="decode"):
        _doc([1], progress)


def test_written_profile_passes_the_rust_loader(tmp_path):
    from tiertp import _scheduler as scheduler
    out = tmp_path / "p.json"
    writer.write_validated(_doc([1, 3], _full_progress([1, 3])), out)
    prof = scheduler.Profile.load(str(out))
    assert prof.tp_levels == [1, 3]
    assert prof.prefill_ms(3, 8, 4) == pytest.approx(312.0)


def test_invalid_profile_never_lands_at_out(tmp_path):
    from tiertp import _scheduler as scheduler
    doc = _doc([1], _full_progress([1]))
    doc["tp_levels"]["1"]["decode"]["latency_ms"][0][0] = -1.0
    out = tmp_path / "p.json"
    with pytest.raises(scheduler.ProfileError, match="latency_ms"):
        writer.write_validated(doc, out)
    assert not out.exists()
    assert json.loads((tmp_path / "p.json.invalid.json").read_text())["format"] == "tiertp-profile"
