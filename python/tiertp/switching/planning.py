"""Turn exported requests into a tiertp.kv migration plan (old layout -> new layout).

The old layout has one TP group per source instance (its ranks' devices,
old ids), the new layout one group: the destination instance (new ids).
Only requests holding KV (kv_len > 0) are planned; the others move as
metadata. Request ids inside the plan are strings "m<i>" (tiertp.kv keys
its results by them); `names` maps them back.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiertp.execution.records import RequestState
from tiertp.kv import KVShape, Layout, MigrationPlan, RequestKV, plan_migration
from tiertp.switching.layout_ids import new_id, old_id


@dataclass(frozen=True)
class SwitchPlan:
    plan: MigrationPlan
    names: dict[str, object]  # plan request id -> instance request id
    kv_tokens: int  # tokens of KV moved (per head set: a request's kv_len, summed)


def plan_switch(shape: KVShape, source_devices: list[tuple[int, ...]], dest_devices: tuple[int, ...],
                states: list[list[RequestState]]) -> SwitchPlan:
    """`states[i]`: what source i exported; `source_devices[i]`: its ranks' devices."""
    old = Layout.of(*[tuple(old_id(d) for d in devs) for devs in source_devices])
    new = Layout.of(tuple(new_id(d) for d in dest_devices))
    requests, names, tokens = [], {}, 0
    for group, exported in enumerate(states):
        for s in exported:
            if s.kv_len == 0:
                continue
            name = f"m{len(names)}"
            names[name] = s.rid
            requests.append(RequestKV(name, s.slots, s.kv_len, group, 0))
            tokens += s.kv_len
    return SwitchPlan(plan_migration(shape, old, new, requests), names, tokens)
