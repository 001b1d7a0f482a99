"""The profile the simulator gets in a fidelity run: the measured profile of
the engine, told what the live workers really have.

- KV capacity: a profile measured on CPU carries none (the measurement sizes
  its own pool); each live execution process holds `kv_capacity_tokens` KV
  slots (the worker's --max-total-tokens), so every TP level gets that.
- TP levels: exactly those the live workers run (`tiertp fidelity
  --tp-levels`, default the worker's, TP 1): the planner then cannot plan a
  level the workers lack, and with several levels the gateway's planner and
  the simulator switch over the same ones. The measured profile must have
  every one of them (`missing_tp_levels`).
- Optionally a calibration of the engine's speed as served: prefill and
  decode cells multiplied by their `CellScale` (the live engine's
  measured/profiled time, from the unloaded probe), a per-iteration
  overhead (ms) added to them (what a step runner costs beyond the forward
  pass the profile times), and a decode step's cost per request beyond the
  first (`decode_ms_per_extra_request`, from the loaded probe: the
  per-token work the serving stack does for each running request). Scales
  1 and both overheads 0 leave the measured tables as they are.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class CellScale:
    """Factors on the profile's prefill and decode cells: a host or serving
    stack may slow one and not the other (a probe's decode ran 13% faster
    than profiled while its prefill matched)."""

    prefill: float = 1.0
    decode: float = 1.0

    def __post_init__(self):
        for name, v in (("prefill", self.prefill), ("decode", self.decode)):
            if not v > 0:
                raise ValueError(f"profile {name} scale must be > 0, got {v}")


def missing_tp_levels(measured: dict, tp_levels) -> list[int]:
    """The levels of `tp_levels` that the profile document has no table for."""
    have = {int(k) for k in measured.get("tp_levels", {})}
    return sorted({int(t) for t in tp_levels} - have)


def check_profile_levels(path: Path, tp_levels) -> None:
    """ValueError naming the missing levels unless the profile file at `path`
    has a table for every level of `tp_levels`."""
    try:
        measured = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--profile {path}: cannot read it as a profile: {e}") from None
    missing = missing_tp_levels(measured, tp_levels)
    if missing:
        have = sorted(int(k) for k in measured.get("tp_levels", {}))
        want = ",".join(map(str, sorted(set(tp_levels))))
        raise ValueError(f"--profile {path} has TP levels {have}; --tp-levels {want} needs a table for each: "
                         f"missing TP level(s) {missing} (measure them: tiertp profile --tp {want} ...)")


def sim_profile_doc(measured: dict, kv_capacity_tokens: int, tp_levels: list[int],
                    iteration_overhead_ms: float = 0.0, scale: CellScale = CellScale(),
                    decode_ms_per_extra_request: float = 0.0) -> dict:
    """A copy of the profile document `measured` with the changes above,
    recorded under provenance.fidelity."""
    if kv_capacity_tokens < 1:
        raise ValueError(f"KV capacity must be >= 1 token, got {kv_capacity_tokens}")
    if iteration_overhead_ms < 0:
        raise ValueError(f"iteration overhead must be >= 0 ms, got {iteration_overhead_ms}")
    if decode_ms_per_extra_request < 0:
        raise ValueError(f"decode cost per extra request must be >= 0 ms, got {decode_ms_per_extra_request}")
    missing = missing_tp_levels(measured, tp_levels)
    if missing:
        have = sorted(int(k) for k in measured["tp_levels"])
        raise ValueError(f"the profile has TP levels {have}; the live workers run {list(tp_levels)} "
                         f"(missing {missing})")
    doc = json.loads(json.dumps(measured))
    doc["tp_levels"] = {k: v for k, v in doc["tp_levels"].items() if int(k) in tp_levels}
    for level in doc["tp_levels"].values():
        level["kv_capacity_tokens"] = int(kv_capacity_tokens)
        for table, factor in (("prefill", scale.prefill), ("decode", scale.decode)):
            if iteration_overhead_ms or factor != 1.0:
                level[table]["latency_ms"] = [[v * factor + iteration_overhead_ms for v in row]
                                              for row in level[table]["latency_ms"]]
        if decode_ms_per_extra_request:
            decode = level["decode"]  # rows by batch size, columns by context
            decode["latency_ms"] = [[v + decode_ms_per_extra_request * (batch - 1) for v in row]
                                    for batch, row in zip(decode["batch_size"], decode["latency_ms"])]
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    doc["provenance"] = {**prov, "fidelity": {
        "kv_capacity_tokens": int(kv_capacity_tokens), "tp_levels": list(tp_levels),
        "iteration_overhead_ms": iteration_overhead_ms, "scale": asdict(scale),
        "decode_ms_per_extra_request": decode_ms_per_extra_request,
        "note": "derived by tiertp fidelity from the measured profile for the simulator"}}
    return doc


def write_sim_profile(measured_path: Path, out_path: Path, kv_capacity_tokens: int, tp_levels: list[int],
                      iteration_overhead_ms: float = 0.0, scale: CellScale = CellScale(),
                      decode_ms_per_extra_request: float = 0.0):
    """Write the simulator's profile and load it (validated) as a tiertp._scheduler.Profile."""
    from tiertp import _scheduler

    doc = sim_profile_doc(json.loads(Path(measured_path).read_text()), kv_capacity_tokens, tp_levels,
                          iteration_overhead_ms, scale, decode_ms_per_extra_request)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    return _scheduler.Profile.load(str(out_path))
