"""`InstanceStepRunner`: the execution process's step runner on a TpInstance (tiertp.execution).

Maps the step interface (tiertp.worker.step_runner.SwitchableStepRunner) onto the
instance: a request the runner has not stepped yet is admitted (prefilled)
in the step it first appears; the others decode; released requests are
handed to the instance with the next step (their KV is freed before that
step's forwards, saving a round trip per finished request). The instance
keeps every request's KV and tokens between steps, so the token lists in
StepInput are read only for new requests.

Which requests run is decided by the caller (the execution process's
RequestTable); this runner only remembers which ones the instance steps, to
tell new requests from running ones and to catch a request left out of a
step. A parked request is not among them: stepping one again without
`unpark` would admit it twice, which the instance refuses.
"""

from __future__ import annotations

from tiertp.execution.errors import InstanceFailed
from tiertp.execution.instance import TpInstance
from tiertp.execution.records import NewRequest, RequestState
from tiertp.execution.spec import InstanceSpec
from tiertp.switching.weight_binder import WEIGHT_BINDER
from tiertp.tp_group import TpGroup
from tiertp.worker.step_runner import ModelLimits, RunnerDied, StepInput, StepOutput, SwitchableStepRunner


class InstanceStepRunner(SwitchableStepRunner):
    def __init__(self, model: str, group: TpGroup, max_total_tokens: int, extra_server_args: dict | None = None,
                 prefill_chunk_tokens: int | None = None, cores_per_rank: int | None = None,
                 weight_stores: dict | None = None):
        binder = {"weight_binder": WEIGHT_BINDER, "weight_binder_arg": dict(weight_stores)} if weight_stores else {}
        self.spec = InstanceSpec(model=model, tp=group.tp, devices=tuple(group.devices),
                                 max_total_tokens=max_total_tokens, prefill_chunk_tokens=prefill_chunk_tokens,
                                 cores_per_rank=cores_per_rank,
                                 extra_server_args=dict(extra_server_args or {}), **binder)
        self.instance: TpInstance | None = None
        self._stepped: set[int] = set()  # in the instance's steps: admitted, adopted or unparked, not released
        self._to_release: list[int] = []

    def start(self) -> ModelLimits:
        self.instance = TpInstance(self.spec)
        info = self.instance.start()
        return ModelLimits(vocab_size=info.vocab_size,
                           max_request_tokens=min(info.context_len, info.kv_capacity_tokens),
                           kv_capacity_tokens=info.kv_capacity_tokens)

    def step(self, batch: list[StepInput]) -> list[StepOutput]:
        missing = self._stepped - {r.rid for r in batch}
        if missing:
            raise RuntimeError(f"requests {sorted(missing)[:8]} were left out of a step without being released")
        admit = [NewRequest(r.rid, r.token_ids, r.sampling) for r in batch if r.rid not in self._stepped]
        release, self._to_release = self._to_release, []
        try:
            outs = {o.rid: o for o in self.instance.iterate(admit, release)}
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        except BaseException:
            self._to_release = release + self._to_release  # a rejected step changed nothing
            raise
        self._stepped |= {r.rid for r in admit}
        return [StepOutput(r.rid, outs[r.rid].token, outs[r.rid].stopped) if r.rid in outs
                else StepOutput(r.rid, None, False) for r in batch]

    def release(self, rids: list[int]) -> None:
        """Stepped or parked requests that left: their KV is freed with the next step (or `pause`)."""
        self._stepped -= set(rids)
        self._to_release += rids

    def set_prefill_chunk(self, tokens: int | None) -> bool:
        try:
            self.instance.set_prefill_chunk(tokens)
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        return True

    # --- switching (tiertp.worker.switch_ops, through the RequestTable) -------
    def pause(self) -> None:
        self.instance.pause()
        # Finished requests' KV is freed lazily with the next step; a paused
        # instance may not step for a long time, and a switch needs the space.
        release, self._to_release = self._to_release, []
        if release:
            try:
                self.instance.release(release)
            except InstanceFailed as e:
                raise RunnerDied(str(e)) from e

    def resume(self) -> None:
        self.instance.resume()

    def park(self, rids: list[int]) -> list[RequestState]:
        """Export and park stepped requests (TpInstance.park)."""
        unknown = [rid for rid in rids if rid not in self._stepped]
        if unknown:
            raise RuntimeError(f"park: requests {unknown[:8]} are not stepped (or already parked) by this runner")
        try:
            states = self.instance.park(list(rids))
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        self._stepped -= set(rids)
        return states

    def unpark(self, rids: list[int]) -> None:
        if not rids:
            return
        try:
            self.instance.unpark(list(rids))
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        self._stepped |= set(rids)

    def adopt(self, states: list[RequestState]) -> None:
        try:
            self.instance.adopt(list(states))
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        self._stepped |= {s.rid for s in states}

    def moved_away(self, rids: list[int]) -> None:
        if not rids:
            return
        try:
            self.instance.release(list(rids))
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        self._stepped -= set(rids)

    def close(self) -> None:
        instance, self.instance = self.instance, None
        if instance is not None:
            instance.close()
