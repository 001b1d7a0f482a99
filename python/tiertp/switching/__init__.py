"""Run-time TP switching and prefill -> decode hand-off (DESIGN.md §3).

Builds on tiertp.execution (the KV-owning `TpInstance`), tiertp.kv (KV
migration between TP layouts) and tiertp.weights (one weight copy per
device). Every TP level a device may run is a warm `TpInstance` whose
parameters are views of the device's weight store (`WEIGHT_BINDER`), so a
switch loads no weight and compiles nothing: it only moves KV.

    coord = SwitchCoordinator()
    result = coord.switch([(tp1_a, rids_a), (tp1_b, rids_b)], tp2)   # two TP1 -> one TP2
    result = coord.hand_off(prefill_tp2, [rid], decode_tp1)          # prefill -> decode
    result.stop_ms, result.parts_ms, result.bytes_between            # pause -> resume, its parts, KV bytes

A failed switch raises `SwitchRolledBack` with everything as before it
(see tiertp.switching.coordinator for the steps and the rollback).
Request ids must be listed by the caller (it knows what each instance
holds); requests not yet prefilled move as metadata and prefill on the
destination.

Modules: coordinator (the steps), participant (what it needs of an instance:
`SwitchParticipant`), planning (exported requests -> tiertp.kv
plan), layout_ids (participant ids: old vs new process of a device),
rank_migrate (what runs inside the ranks), control_store (the TCPStore the
instances' ranks meet through), relay (the slow path through the controller
for TP levels tiertp.kv does not plan, e.g. TP3 of SmolLM2's 3 KV heads),
weight_binder (InstanceSpec.weight_binder over tiertp.weights), result, errors.

A hand-off is overlapped with the prefill instance's next iterations: its
requests are parked there while their KV moves (see the coordinator).
Limits: the relay path copies through the controller's pipes (correct, not
fast) and resumes the source only once the relay is done.
"""

from tiertp.switching.control_store import ControlStore
from tiertp.switching.coordinator import SwitchCoordinator
from tiertp.switching.errors import SwitchError, SwitchRolledBack, SwitchSetupError
from tiertp.switching.result import SwitchResult
from tiertp.switching.weight_binder import STORE_SHARING, WEIGHT_BINDER

__all__ = ["STORE_SHARING", "WEIGHT_BINDER", "ControlStore", "SwitchCoordinator", "SwitchError", "SwitchResult",
           "SwitchRolledBack", "SwitchSetupError"]
