"""`InstanceStepRunner`: the execution process's StepRunner on a TpInstance.

Maps the step interface (tiertp.worker.runner) onto the instance: a request
the runner has not seen is admitted (prefilled) in the step it first
appears; the others decode; released requests are handed to the instance
with the next step (their KV is freed before that step's forwards, saving a
round trip per finished request). The instance keeps every request's KV and
tokens between steps, so the token lists in StepInput are read only for new
requests. Parked requests (a hand-off in flight: `park`) are left out of
the steps until they are unparked, released or moved away.
"""

from __future__ import annotations

from tiertp.execution.errors import InstanceFailed
from tiertp.execution.instance import TpInstance
from tiertp.execution.records import NewRequest, Sampling
from tiertp.execution.spec import InstanceSpec
from tiertp.worker.groups import TpGroup
from tiertp.worker.runner import ModelLimits, RunnerDied, StepInput, StepOutput, StepRunner


class InstanceStepRunner(StepRunner):
    def __init__(self, model: str, group: TpGroup, max_total_tokens: int, extra_server_args: dict | None = None,
                 prefill_chunk_tokens: int | None = None, cores_per_rank: int | None = None,
                 weight_stores: dict | None = None):
        from tiertp.switching.weight_binder import WEIGHT_BINDER

        binder = {"weight_binder": WEIGHT_BINDER, "weight_binder_arg": dict(weight_stores)} if weight_stores else {}
        self.spec = InstanceSpec(model=model, tp=group.tp, devices=tuple(group.devices),
                                 max_total_tokens=max_total_tokens, prefill_chunk_tokens=prefill_chunk_tokens,
                                 cores_per_rank=cores_per_rank,
                                 extra_server_args=dict(extra_server_args or {}), **binder)
        self.instance: TpInstance | None = None
        self._held: set[int] = set()  # requests the instance holds, released ones excluded
        self._to_release: list[int] = []
        self._parked: set[int] = set()  # held, but not stepped (see `park`)

    def start(self) -> ModelLimits:
        self.instance = TpInstance(self.spec)
        info = self.instance.start()
        return ModelLimits(vocab_size=info.vocab_size,
                           max_request_tokens=min(info.context_len, info.kv_capacity_tokens),
                           kv_capacity_tokens=info.kv_capacity_tokens)

    def step(self, batch: list[StepInput]) -> list[StepOutput]:
        rids = {r.rid for r in batch}
        missing = self._held - self._parked - rids
        if missing:
            raise RuntimeError(f"requests {sorted(missing)[:8]} were left out of a step without being released")
        stepped_parked = rids & self._parked
        if stepped_parked:
            raise RuntimeError(f"requests {sorted(stepped_parked)[:8]} are parked (a hand-off is in flight); "
                               "unpark them before stepping them")
        admit = [NewRequest(r.rid, r.token_ids, Sampling(r.temperature, r.top_p, r.seed, r.stop_token_ids))
                 for r in batch if r.rid not in self._held]
        release, self._to_release = self._to_release, []
        try:
            outs = {o.rid: o for o in self.instance.iterate(admit, release)}
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        except BaseException:
            self._to_release = release + self._to_release  # a rejected step changed nothing
            raise
        self._held |= {r.rid for r in admit}
        return [StepOutput(r.rid, outs[r.rid].token, outs[r.rid].stopped) if r.rid in outs
                else StepOutput(r.rid, None, False) for r in batch]

    def release(self, rids: list[int]) -> None:
        for rid in rids:
            if rid in self._held:
                self._held.discard(rid)
                self._parked.discard(rid)  # a parked request's KV is freed like any other's
                self._to_release.append(rid)

    def set_prefill_chunk(self, tokens: int | None) -> bool:
        try:
            self.instance.set_prefill_chunk(tokens)
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        return True

    # --- switching (tiertp.worker.switch_ops) --------------------------
    def flush_releases(self) -> None:
        """Free released requests' KV now instead of with the next step."""
        release, self._to_release = self._to_release, []
        if release:
            try:
                self.instance.release(release)
            except InstanceFailed as e:
                raise RunnerDied(str(e)) from e

    def adopted(self, rids: list[int]) -> None:
        """The instance adopted these requests (KV included): they decode, not prefill."""
        self._held |= set(rids)

    def moved_away(self, rids: list[int]) -> None:
        """The requests left for another instance, which already freed their KV here."""
        self._held -= set(rids)
        self._parked -= set(rids)

    def park(self, rids: list[int]) -> list:
        """Export and park held requests (TpInstance.park): steps leave them out
        until `unpark`, `release` or `moved_away`. Their RequestStates."""
        unknown = [rid for rid in rids if rid not in self._held or rid in self._parked]
        if unknown:
            raise RuntimeError(f"park: requests {unknown[:8]} are not held (or already parked) by this runner")
        try:
            states = self.instance.park(list(rids))
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        self._parked |= set(rids)
        return states

    def unpark(self, rids: list[int]) -> None:
        """Parked requests continue decoding here (the next step gives their next token)."""
        rids = [rid for rid in rids if rid in self._parked]
        if not rids:
            return
        try:
            self.instance.unpark(rids)
        except InstanceFailed as e:
            raise RunnerDied(str(e)) from e
        self._parked -= set(rids)

    def close(self) -> None:
        instance, self.instance = self.instance, None
        if instance is not None:
            instance.close()
