"""The node agent's pure parts: TP groups, plan validation, message parsing,
the request table. No processes, no engines."""

from __future__ import annotations

import math

import msgspec
import pytest

from tiertp.tp_group import GroupError, TpGroup
from tiertp.worker import protocol as P
from tiertp.worker.config import check_model_fits_tp_levels
from tiertp.worker.groups import aligned_groups
from tiertp.worker.layout_change import LayoutChange, layout_changes
from tiertp.worker.messages import PlanMove, parse_apply_plan, parse_submit
from tiertp.worker.plan import PlanRejected, check_plan, initial_assignments
from tiertp.worker.requests import RequestTable
from tiertp.worker.switcher import split_shares


def _plan(*devices, plan_id=1):
    return parse_apply_plan({"type": "apply_plan", "plan_id": plan_id, "devices": [
        {"device": d, "role": role, "tier": tier, "tp_group": list(group), "batch_cap": 4, "token_cap": 0}
        for d, role, tier, group in devices]})


@pytest.mark.parametrize("group, problem", [
    ((1, 2), "misaligned"), ((2, 4), "misaligned"), ((0, 3), "not a power of two"), ((4, 4), "unknown device"),
    ((6, 2), "unknown device"),
])
def test_bad_groups_name_the_problem(group, problem):
    with pytest.raises(GroupError, match=problem):
        TpGroup(*group).check(num_devices=4)


def test_aligned_groups_are_contiguous_power_of_two_sets():
    assert aligned_groups(4, [1, 2, 4]) == [TpGroup(0, 1), TpGroup(1, 1), TpGroup(2, 1), TpGroup(3, 1),
                                            TpGroup(0, 2), TpGroup(2, 2), TpGroup(0, 4)]


@pytest.mark.parametrize("devices, problem", [
    ([(0, "decode", "chat", (1, 2))], "misaligned"),
    ([(5, "decode", "chat", (5, 1))], "unknown device 5"),
    ([(0, "decode", "chat", (0, 1)), (0, "decode", "chat", (0, 1))], "listed twice"),
    ([(0, "decode", "chat", (2, 1))], "not in its TP group"),
    ([(0, "decode", "chat", (0, 8))], "unknown device"),
    ([(0, "decode", "chat", (0, 2)), (1, "prefill", "chat", (0, 2))], "different groups, roles or tiers"),
    ([(0, "decode", "chat", (0, 2))], "different groups, roles or tiers"),  # device 1 left at TP1
])
def test_bad_plans_are_rejected_with_a_reason(devices, problem):
    current = initial_assignments(4, batch_cap=8, token_cap=0)
    with pytest.raises(PlanRejected, match=problem):
        check_plan(_plan(*devices), current, tp_levels=[1, 2, 4])
    assert current == initial_assignments(4, batch_cap=8, token_cap=0)


def test_tp_level_outside_the_agents_levels_is_rejected():
    current = initial_assignments(4, batch_cap=8, token_cap=0)
    with pytest.raises(PlanRejected, match="TP level 2 is not one this agent runs"):
        check_plan(_plan((0, "decode", "chat", (0, 2)), (1, "decode", "chat", (0, 2))), current, tp_levels=[1])


def test_plan_changing_tp_groups_is_valid_and_names_the_new_groups():
    current = initial_assignments(4, batch_cap=8, token_cap=0)
    new = check_plan(_plan((0, "decode", "chat", (0, 2)), (1, "decode", "chat", (0, 2))), current, tp_levels=[1, 2])
    assert new[0].tp_group == new[1].tp_group == TpGroup(0, 2)
    assert new[2] == current[2] and new[3] == current[3]


G = TpGroup


@pytest.mark.parametrize("old, new, changes", [
    ({G(0, 1), G(1, 1)}, {G(0, 2)}, [LayoutChange((G(0, 1), G(1, 1)), (G(0, 2),))]),  # merge
    ({G(0, 2)}, {G(0, 1), G(1, 1)}, [LayoutChange((G(0, 2),), (G(0, 1), G(1, 1)))]),  # split
    ({G(0, 4)}, {G(0, 2), G(2, 1), G(3, 1)}, [LayoutChange((G(0, 4),), (G(0, 2), G(2, 1), G(3, 1)))]),
    # two independent parts: {0,1} splits while {2,3} merges
    ({G(0, 2), G(2, 1), G(3, 1)}, {G(0, 1), G(1, 1), G(2, 2)},
     [LayoutChange((G(0, 2),), (G(0, 1), G(1, 1))), LayoutChange((G(2, 1), G(3, 1)), (G(2, 2),))]),
    ({G(0, 1), G(1, 1)}, {G(0, 1), G(1, 1)}, []),
])
def test_layout_changes_are_merges_and_splits_that_undo_by_reversal(old, new, changes):
    assert layout_changes(old, new) == changes
    assert layout_changes(new, old) == [c.reversed() for c in changes]


def test_plan_without_tp_change_updates_roles_tiers_and_caps_only_of_listed_devices():
    current = initial_assignments(2, batch_cap=8, token_cap=0)
    new = check_plan(_plan((1, "prefill", "agent", (1, 1))), current, tp_levels=[1, 2])
    assert (new[1].role, new[1].tier, new[1].batch_cap, new[1].tp_group) == ("prefill", "agent", 4, TpGroup(1, 1))
    assert new[0] == current[0]


@pytest.mark.parametrize("field, value, problem", [
    ("role", "leader", "unknown role 'leader'; expected one of: prefill, decode, colocated"),
    ("tp_group", [0], r"tp_group must be \[first_gpu, tp\]"),
    ("batch_cap", 0, "batch_cap = 0 is out of range"),
    ("device", -1, "device = -1 is out of range"),
])
def test_malformed_plan_fields_are_named(field, value, problem):
    d = {"device": 0, "role": "decode", "tier": "chat", "tp_group": [0, 1], "batch_cap": 4, "token_cap": 0}
    d[field] = value
    with pytest.raises(P.ProtocolError, match=problem):
        parse_apply_plan({"type": "apply_plan", "plan_id": 1, "devices": [d]})


def _submit(**over):
    msg = {"type": "submit", "id": 7, "tier": "chat", "input_ids": [1, 2, 3], "class": "feasible",
           "sampling": {"max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "seed": None, "stop_token_ids": []}}
    msg.update(over)
    return msg


@pytest.mark.parametrize("over, problem", [
    ({"input_ids": []}, "input_ids is empty"),
    ({"input_ids": [1, "a"]}, r"input_ids\[1\] must be an integer"),
    ({"class": "urgent"}, "unknown class 'urgent'; expected one of: feasible, best_effort, background"),
    ({"sampling": {"max_tokens": 0}}, "sampling.max_tokens = 0 is out of range"),
    ({"sampling": {"max_tokens": 4, "top_p": 0}}, r"top_p must be in \(0, 1\]"),
    ({"tier": None}, "tier must be a string"),
    ({"group": [1]}, "group must be"),
    ({"start_within_s": "soon"}, "start_within_s must be a number"),
    ({"start_within_s": float("nan")}, "start_within_s must be a number of seconds, got NaN"),
])
def test_bad_submits_name_the_field_and_carry_the_id(over, problem):
    with pytest.raises(P.ProtocolError, match=problem) as e:
        parse_submit(_submit(**over))
    assert e.value.request_id == 7 and e.value.code == P.BAD_REQUEST


def test_start_within_s_is_optional_and_fixes_the_deadline_from_the_arrival():
    for msg in (_submit(), _submit(start_within_s=None)):  # absent or nil: no deadline
        s = parse_submit(msg)
        assert s.start_within_s is None and s.deadline(5.0) == math.inf
    assert parse_submit(_submit(start_within_s=0.25)).deadline(10.0) == 10.25
    assert parse_submit(_submit(start_within_s=2)).start_within_s == 2.0  # msgpack may carry an integer
    assert parse_submit(_submit(start_within_s=-1.0)).deadline(10.0) == 9.0  # already late: shed, not refused


def test_submit_without_valid_id_carries_no_id():
    with pytest.raises(P.ProtocolError, match="missing field 'id'") as e:
        parse_submit({"type": "submit"})
    assert e.value.request_id is None


@pytest.mark.parametrize("frame, problem", [
    (b"\xc1", "not valid msgpack"), (msgspec.msgpack.encode([1]), "must be a msgpack map"),
    (msgspec.msgpack.encode({"id": 1}), 'no string "type"'),
])
def test_undecodable_frames_are_protocol_errors(frame, problem):
    with pytest.raises(P.ProtocolError, match=problem):
        P.decode(frame)


def test_request_table_ends_each_request_once():
    table = RequestTable()
    req = table.add(b"client-a", parse_submit(_submit()), TpGroup(0, 1))
    other = table.add(b"client-b", parse_submit(_submit()), TpGroup(0, 1))  # ids are per client
    assert req.rid != other.rid
    with pytest.raises(ValueError, match="already in flight"):
        table.add(b"client-a", parse_submit(_submit()), TpGroup(0, 1))
    assert table.finish(req.rid) is req
    assert table.finish(req.rid) is None
    assert table.lookup(b"client-a", 7) is None and table.lookup(b"client-b", 7) is other


def test_tp_levels_the_models_heads_cannot_split_are_refused_at_start():
    check_model_fits_tp_levels("tiny-llama", (1, 2, 4))
    with pytest.raises(ValueError, match=r"9 attention heads and 3 KV heads.*TP 2 \(levels that fit: \[1, 3\]\)"):
        check_model_fits_tp_levels("smollm2-135m", (1, 2))


def test_a_plans_moves_name_each_request_and_its_new_group():
    d = {"device": 0, "role": "colocated", "tier": "chat", "tp_group": [0, 2], "batch_cap": 4, "token_cap": 0}
    plan = parse_apply_plan({"type": "apply_plan", "plan_id": 3, "devices": [d, {**d, "device": 1}],
                             "moves": [{"id": 7, "tp_group": [0, 2]}]})
    assert plan.moves == (PlanMove(7, TpGroup(0, 2)),)
    assert _plan((0, "colocated", "chat", (0, 1))).moves == ()  # optional
    for moves, problem in [({"id": 7}, "moves must be a list"), ([{"id": 7}], r"moves\[0\]: missing field 'tp_group'"),
                           ([[7, [0, 2]]], r"moves\[0\] must be a map")]:
        with pytest.raises(P.ProtocolError, match=problem):
            parse_apply_plan({"type": "apply_plan", "plan_id": 3, "devices": [d], "moves": moves})


def test_a_split_sends_each_running_request_where_the_plan_placed_it_and_balances_the_rest():
    a, b = TpGroup(0, 1), TpGroup(1, 1)
    kv = {1: 100, 2: 50, 3: 40, 4: 30}.__getitem__
    # The plan puts 1 and 2 on b; 3 and 4 it did not know: they go where the KV is least.
    assert split_shares([1, 2, 3, 4], [a, b], {1: b, 2: b, 9: a}, kv) == [[3, 4], [1, 2]]
    # A destination outside the split is no choice.
    assert split_shares([1, 2], [a, b], {1: TpGroup(2, 1)}, kv) == [[1], [2]]
