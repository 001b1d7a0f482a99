"""The real classes provide the interfaces their callers are typed against.

SwitchCoordinator takes any `SwitchParticipant`: a TpInstance in its own
process, or the agent's RemoteInstance proxy of one; the execution process's
BatchState takes a `StepRunner`, and switches need a `SwitchableStepRunner`.
Each method must exist with the protocol's parameters, not only by name.
"""

from __future__ import annotations

import inspect
import pickle
from types import SimpleNamespace

import pytest

from tiertp.execution.instance import TpInstance
from tiertp.execution.spec import InstanceSpec
from tiertp.switching.participant import RelayParticipant, SwitchParticipant
from tiertp.tp_group import TpGroup
from tiertp.worker import instance_ops
from tiertp.worker.batch_state import BatchState
from tiertp.worker.engine_runner import EngineStepRunner
from tiertp.worker.instance_runner import InstanceStepRunner
from tiertp.worker.process import READY
from tiertp.worker.remote_instance import RemoteInstance
from tiertp.worker.step_runner import StepRunner, SwitchableStepRunner
from tiertp.worker.switch_ops import SwitchOps


class _Offline(RemoteInstance):
    """A RemoteInstance whose process answers nothing (no op is sent)."""

    def _call(self, op):
        return None


def _remote() -> RemoteInstance:
    proc = SimpleNamespace(group=TpGroup(0, 1), state=READY, popen=SimpleNamespace(poll=lambda: None))
    return _Offline(proc, "tiny-llama", dispatch=lambda *_: None, max_tokens=lambda _rid: 1)


def _methods(protocol) -> list[str]:
    return [name for name, member in vars(protocol).items()
            if callable(member) and not name.startswith("_") and not isinstance(member, type)]


def _same_parameters(cls, protocol) -> None:
    for name in _methods(protocol):
        want = list(inspect.signature(getattr(protocol, name)).parameters)
        have = list(inspect.signature(getattr(cls, name)).parameters)
        assert have == want, f"{cls.__name__}.{name}{have} does not match {protocol.__name__}.{name}{want}"


def test_a_tp_instance_is_a_switch_and_relay_participant():
    inst = TpInstance(InstanceSpec("tiny-llama"))  # not started: nothing runs
    assert isinstance(inst, SwitchParticipant) and isinstance(inst, RelayParticipant)
    _same_parameters(TpInstance, SwitchParticipant)
    _same_parameters(TpInstance, RelayParticipant)


def test_a_remote_instance_is_a_switch_participant_that_cannot_relay():
    remote = _remote()
    assert isinstance(remote, SwitchParticipant)
    assert not isinstance(remote, RelayParticipant)  # the relay reads KV through its own process
    _same_parameters(RemoteInstance, SwitchParticipant)


def test_the_runners_provide_what_the_execution_process_needs():
    instance_runner = InstanceStepRunner("tiny-llama", TpGroup(0, 1), max_total_tokens=64)
    engine_runner = EngineStepRunner("tiny-llama", TpGroup(0, 1), max_total_tokens=64)
    assert isinstance(instance_runner, SwitchableStepRunner)
    assert isinstance(engine_runner, StepRunner) and not isinstance(engine_runner, SwitchableStepRunner)
    _same_parameters(InstanceStepRunner, SwitchableStepRunner)
    _same_parameters(InstanceStepRunner, StepRunner)
    _same_parameters(EngineStepRunner, StepRunner)


def test_switch_ops_need_a_runner_with_an_instance_and_name_the_ops_they_know():
    engine_runner = EngineStepRunner("tiny-llama", TpGroup(0, 1), max_total_tokens=64)
    ops = SwitchOps(BatchState(engine_runner, batch_cap=4, token_cap=0), send=lambda _m: None,
                    send_load=lambda: None)
    answer = ops.handle({"op_id": 7, "op": pickle.dumps(instance_ops.Pause())})
    assert (answer["op_id"], answer["ok"]) == (7, False) and "owns no TP instance" in answer["error"]
    with pytest.raises(ValueError, match="expected one of: info, pause, resume, export, park, unpark, adopt, "
                                         "release, free_slots, call"):
        ops.apply("pause")
