"""The profile the simulator gets in a fidelity run: the measured profile of
the engine, told what the live workers really have.

- KV capacity: a profile measured on CPU carries none (the measurement sizes
  its own pool); each live execution process holds `kv_capacity_tokens` KV
  slots (the worker's --max-total-tokens), so every TP level gets that.
- TP levels: only those the live workers run (TP 1 today); the planner then
  cannot plan a TP switch the workers would reject.
- Optionally a calibration of the engine's speed: every cell multiplied by
  `scale` (the live engine's measured/profiled iteration time, from the
  unloaded probe) and/or a per-iteration overhead (ms) added to it (what a
  step runner costs beyond the forward pass the profile times). scale 1 and
  overhead 0 leave the measured tables as they are.
"""

from __future__ import annotations

import json
from pathlib import Path


def sim_profile_doc(measured: dict, kv_capacity_tokens: int, tp_levels: list[int],
                    iteration_overhead_ms: float = 0.0, scale: float = 1.0) -> dict:
    """A copy of the profile document `measured` with the changes above,
    recorded under provenance.fidelity."""
    if kv_capacity_tokens < 1:
        raise ValueError(f"KV capacity must be >= 1 token, got {kv_capacity_tokens}")
    if not scale > 0:
        raise ValueError(f"profile scale must be > 0, got {scale}")
    if iteration_overhead_ms < 0:
        raise ValueError(f"iteration overhead must be >= 0 ms, got {iteration_overhead_ms}")
    have = sorted(int(k) for k in measured["tp_levels"])
    missing = [tp for tp in tp_levels if tp not in have]
    if missing:
        raise ValueError(f"the profile has TP levels {have}; the live workers run {tp_levels} (missing {missing})")
    doc = json.loads(json.dumps(measured))
    doc["tp_levels"] = {k: v for k, v in doc["tp_levels"].items() if int(k) in tp_levels}
    for level in doc["tp_levels"].values():
        level["kv_capacity_tokens"] = int(kv_capacity_tokens)
        if iteration_overhead_ms or scale != 1.0:
            for table in ("prefill", "decode"):
                level[table]["latency_ms"] = [[v * scale + iteration_overhead_ms for v in row]
                                              for row in level[table]["latency_ms"]]
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    doc["provenance"] = {**prov, "fidelity": {
        "kv_capacity_tokens": int(kv_capacity_tokens), "tp_levels": list(tp_levels),
        "iteration_overhead_ms": iteration_overhead_ms, "scale": scale,
        "note": "derived by tiertp fidelity from the measured profile for the simulator"}}
    return doc


def write_sim_profile(measured_path: Path, out_path: Path, kv_capacity_tokens: int, tp_levels: list[int],
                      iteration_overhead_ms: float = 0.0, scale: float = 1.0):
    """Write the simulator's profile and load it (validated) as a tiertp._scheduler.Profile."""
    from tiertp import _scheduler

    doc = sim_profile_doc(json.loads(Path(measured_path).read_text()), kv_capacity_tokens, tp_levels,
                          iteration_overhead_ms, scale)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    return _scheduler.Profile.load(str(out_path))
