"""Per-device assignments and the validation of `apply_plan`.

`check_plan` is pure: it compares a requested plan with the current
assignments and either raises PlanRejected (the reason names the problem) or
returns the new assignments. The agent applies the result only when no
exception was raised, which is what makes `apply_plan` atomic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tiertp.tp_group import GroupError, TpGroup
from tiertp.worker.messages import ApplyPlan

class PlanRejected(ValueError):
    """A plan the agent will not apply; the message is the `reason`."""


@dataclass(frozen=True)
class DeviceAssignment:
    """What one device does now. `tier` None: serves every tier (before any plan)."""

    device: int
    role: str
    tier: str | None
    tp_group: TpGroup
    batch_cap: int
    token_cap: int


def initial_assignments(num_devices: int, batch_cap: int, token_cap: int) -> dict[int, DeviceAssignment]:
    """Before the first plan: every device colocated at TP1, serving every tier."""
    return {d: DeviceAssignment(d, "colocated", None, TpGroup(d, 1), batch_cap, token_cap) for d in range(num_devices)}


def check_plan(plan: ApplyPlan, current: dict[int, DeviceAssignment],
               tp_levels: list[int]) -> dict[int, DeviceAssignment]:
    """The assignments after `plan`, or PlanRejected naming the first problem.

    A plan lists any subset of the node's devices (unlisted ones keep their
    assignment). Rejected: a device listed twice or unknown; a TP group that
    is misaligned, not a power of two, outside the node, or at a TP level the
    agent was not started with; a group that does not contain its device;
    devices of one group that disagree on group, role or tier. A change of
    TP groups is allowed here; the agent turns it into a TP switch.
    """
    num_devices = len(current)
    seen: set[int] = set()
    new = dict(current)
    for d in plan.devices:
        if d.device >= num_devices:
            raise PlanRejected(f"unknown device {d.device}: this node has devices 0..{num_devices - 1}")
        if d.device in seen:
            raise PlanRejected(f"device {d.device} is listed twice")
        seen.add(d.device)
        try:
            d.tp_group.check(num_devices)
        except GroupError as e:
            raise PlanRejected(f"device {d.device}: {e}") from None
        if d.tp_group.tp not in tp_levels:
            raise PlanRejected(f"device {d.device}: TP level {d.tp_group.tp} is not one this agent runs "
                               f"(--tp-levels {','.join(map(str, tp_levels))})")
        if d.device not in d.tp_group.devices:
            raise PlanRejected(f"device {d.device} is not in its TP group {d.tp_group.as_list()}")
        new[d.device] = replace(current[d.device], role=d.role, tier=d.tier, tp_group=d.tp_group,
                                batch_cap=d.batch_cap, token_cap=d.token_cap)
    for a in new.values():
        for other in a.tp_group.devices:
            b = new[other]
            if (b.tp_group, b.role, b.tier) != (a.tp_group, a.role, a.tier):
                raise PlanRejected(f"devices {a.device} and {other} share TP group {a.tp_group.as_list()} but the "
                                   f"plan gives them different groups, roles or tiers")
    return new
