"""`SwitchCoordinator`: move requests, KV included, from TP instances to another one.

One mechanism for both uses of the issue:
- a TP switch (`switch`): every request of the source instance(s) (e.g. one
  TP1, or two TP1 -> one TP2) moves to a warm destination instance at the
  new TP level on the same devices; the sources are left paused (idle);
- a prefill -> decode hand-off (`hand_off`): some requests of a prefill
  instance move to a decode instance (TP levels and devices may differ);
  both keep running.

Steps (tiertp.execution's "How TP switching plugs in"): pause every instance
involved (an iteration boundary: between two commands the ranks are
quiescent), export the requests, plan the KV migration from the sources'
layout to the destination's (tiertp.switching.planning), run
tiertp.kv.migrate inside every rank of every instance at once
(tiertp.switching.rank_migrate; one StoreControlGroup per switch over the
coordinator's TCPStore; on CPU the destination ranks copy the KV straight
out of the sources' pools, in shared memory), adopt the requests on
the destination (requests without KV move as metadata and prefill there),
resume the destination (the end of the stop time), release the requests on
the sources.

Rollback: until the destination adopted the requests, a failure anywhere
(MigrationAborted: the destination is out of KV space, a rank error, a rank
that died) undoes the switch: destination ranks free the slots they had
allocated, every instance returns to its pause state of before, and
SwitchRolledBack is raised. The sources were only read, so their requests
continue exactly as if nothing had happened.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tiertp.execution.instance import TpInstance
from tiertp.execution.records import RequestId
from tiertp.kv.executor import DEFAULT_CHUNK_BYTES
from tiertp.switching import rank_migrate
from tiertp.switching.control_store import ControlStore
from tiertp.switching.errors import SwitchRolledBack, SwitchSetupError
from tiertp.switching.layout_ids import new_id, old_id
from tiertp.switching.planning import SwitchPlan, kv_shape, plan_switch
from tiertp.switching.relay import plannable, relay
from tiertp.switching.result import SwitchResult

Source = tuple[TpInstance, Sequence[RequestId]]

# Small migrations use smaller staging chunks: two of them still pipeline,
# and the shared-memory segments stay small (they are created per switch).
_MIN_CHUNK_BYTES = 64 << 10


class SwitchCoordinator:
    """Runs switches and hand-offs between TP instances this process controls.

    `timeout_s` bounds every wait of a rank on its peers during a migration.
    One coordinator hosts one control store, reused by all its switches."""

    def __init__(self, timeout_s: float = 60.0, chunk_bytes: int | None = None, store: ControlStore | None = None):
        self.timeout_s, self.chunk_bytes = timeout_s, chunk_bytes
        self.store = store or ControlStore(timeout_s=timeout_s)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> SwitchCoordinator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def warm(self, *instances: TpInstance) -> None:
        """Prepare started instances for switches (imports, store connection,
        KV pool moved into shared memory in every rank), so the first switch
        costs what the others do. Optional."""
        for inst in instances:
            inst.call_on_ranks(rank_migrate.WARM, self.store.address)

    # --- the two uses ---------------------------------------------------
    def switch(self, sources: Sequence[Source], dest: TpInstance) -> SwitchResult:
        """Move the listed requests (all of each source's) to `dest`; the
        sources stay paused afterwards, `dest` runs."""
        return self._transfer(list(sources), dest, keep_sources_paused=True)

    def hand_off(self, source: TpInstance, rids: Sequence[RequestId], dest: TpInstance) -> SwitchResult:
        """Move `rids` from `source` to `dest`; both run afterwards."""
        return self._transfer([(source, rids)], dest, keep_sources_paused=False)

    # --- the mechanism --------------------------------------------------
    def _transfer(self, sources: list[Source], dest: TpInstance, keep_sources_paused: bool) -> SwitchResult:
        _check(sources, dest)
        instances = [src for src, _ in sources] + [dest]
        was_paused = [inst.paused for inst in instances]
        clock = _Clock()
        for inst in instances:
            inst.pause()
        try:
            exported = [src.export(list(rids)) for src, rids in sources]
            clock.mark("export")
            if all(plannable(inst.spec.tp) for inst in instances):
                sp = plan_switch(kv_shape(dest.info), [src.spec.devices for src, _ in sources], dest.spec.devices,
                                 exported)
                clock.mark("plan")
                by_name, moved_bytes, rank_ms = (self._migrate(sp, sources, dest) if sp.plan.moves
                                                 else ({}, (0, 0, 0), 0.0))
                pages = {sp.names[name]: slots for name, slots in by_name.items()}
                path = "kv-migrate"
            else:  # e.g. TP3: tiertp.kv plans power-of-two levels only
                pages, relayed = relay([(src, states) for (src, _), states in zip(sources, exported)], dest)
                moved_bytes, rank_ms, path = (relayed, 0, 0), 0.0, "relay"
            clock.mark("migrate")
            states = [s.with_slots(pages[s.rid]) if s.kv_len else s for batch in exported for s in batch]
            try:
                if states:
                    dest.adopt(states)
            except BaseException:
                if pages and not _is_closed(dest):
                    try:
                        dest.free_slots([slot for slots in pages.values() for slot in slots])
                    except Exception:  # noqa: BLE001 - the adopt's failure is the one to report
                        pass
                raise
            clock.mark("adopt")
        except BaseException as e:
            lost = self._restore(sources, instances, was_paused)
            raise SwitchRolledBack(_describe(e), lost) from e
        # Committed: the destination holds the requests from here on and may
        # run at once; the sources free their copies after (still paused).
        dest.resume()
        stop_ms = clock.total()
        try:
            for src, rids in sources:
                if rids:
                    src.release(list(rids))
            clock.mark("release_after_resume")
        finally:
            for inst, paused in zip(instances[:-1], was_paused):
                if not (keep_sources_paused or paused) and not _is_closed(inst):
                    inst.resume()
        moved = [s for batch in exported for s in batch if s.kv_len]
        return SwitchResult(moved=tuple(s.rid for s in moved),
                            metadata_only=tuple(s.rid for batch in exported for s in batch if not s.kv_len),
                            kv_tokens=sum(s.kv_len for s in moved), bytes_between=moved_bytes[0],
                            bytes_local=moved_bytes[1], bytes_pulled=moved_bytes[2], stop_ms=stop_ms,
                            parts_ms={**clock.parts, "migrate_rank_max": rank_ms}, path=path)

    def _migrate(self, sp: SwitchPlan, sources: list[Source], dest: TpInstance):
        """tiertp.kv.migrate on every rank at once. Returns (plan request id ->
        destination slots, (bytes between processes, bytes local, bytes the
        destination pulled), slowest rank's ms).
        On failure the destination ranks' slots are freed and the error raised."""
        plan = sp.plan
        members = sum(src.spec.tp for src, _ in sources) + dest.spec.tp
        address, name = self.store.address, self.store.new_name()
        chunk = self.chunk_bytes or _chunk_bytes(plan)
        calls, first = [], 0
        for inst, role, to_id in [(src, "old", old_id) for src, _ in sources] + [(dest, "new", new_id)]:
            ids = tuple(to_id(d) for d in inst.spec.devices)
            calls.append((inst, rank_migrate.MigrationCall(plan, ids, role, first, members, address, name,
                                                           self.timeout_s, chunk)))
            first += inst.spec.tp
        # The destination first: its ranks do the copying (they pull from the
        # sources' pools) and its call has the longest way to its ranks.
        calls.insert(0, calls.pop())
        started, errors = [], []
        for inst, call in calls:
            try:
                started.append((inst, inst.begin_call(rank_migrate.RUN, call, timeout_s=3 * self.timeout_s)))
            except Exception as e:  # this instance is gone; its peers time out and report it too
                errors.append(f"TP{inst.spec.tp} instance on devices {list(inst.spec.devices)}: {_describe(e)}")
        results = {}
        for inst, pending in started:
            try:
                results[id(inst)] = pending.result()
            except Exception as e:
                errors.append(f"TP{inst.spec.tp} instance on devices {list(inst.spec.devices)}: {_describe(e)}")
        per_rank = results.get(id(dest))
        errors += _by_message([(r["id"], r["error"]) for rs in results.values() for r in rs if "error" in r])
        if not errors and any(r["pages_digest"] != per_rank[0]["pages_digest"] for r in per_rank):
            errors.append("the destination's ranks allocated different slots (they must agree)")
        if errors:
            if per_rank is not None and not _is_closed(dest):
                try:
                    dest.call_on_ranks(rank_migrate.FREE, name)
                except Exception as e:  # noqa: BLE001 - reported with the failure that caused it
                    errors.append(f"freeing the destination's slots failed too: {_describe(e)}")
            raise _MigrationFailed("; ".join(_dedupe(errors)))
        between = sum(r["bytes_sent"] for src, _ in sources for r in results[id(src)])
        local = sum(r["bytes_local"] for rs in results.values() for r in rs)
        pulled = sum(r["bytes_pulled"] for r in per_rank)
        rank_ms = max(r["ms"] for rs in results.values() for r in rs)
        return per_rank[0]["pages"], (between, local, pulled), rank_ms

    @staticmethod
    def _restore(sources: list[Source], instances: list[TpInstance], was_paused: list[bool]) -> tuple[int, ...]:
        """Put every live instance back in its pause state; the indexes of sources that died."""
        for inst, paused in zip(instances, was_paused):
            if not paused and not _is_closed(inst):
                inst.resume()
        return tuple(i for i, (src, _) in enumerate(sources) if _is_closed(src))


class _MigrationFailed(Exception):
    """Some participant of the migration failed (message: every failure)."""


class _Clock:
    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.parts: dict[str, float] = {}

    def mark(self, what: str) -> None:
        now = time.perf_counter()
        self.parts[what] = (now - self.last) * 1e3
        self.last = now

    def total(self) -> float:
        return (time.perf_counter() - self.start) * 1e3


def _chunk_bytes(plan) -> int:
    widest_pair = max((plan.bytes_between(s, d) for s, d in plan.remote_pairs()), default=0)
    return max(_MIN_CHUNK_BYTES, min(DEFAULT_CHUNK_BYTES, -(-widest_pair // 2)))


def _check(sources: list[Source], dest: TpInstance) -> None:
    if not sources:
        raise SwitchSetupError("a switch needs at least one source instance")
    for inst in [src for src, _ in sources] + [dest]:
        if inst.info is None or _is_closed(inst):
            raise SwitchSetupError(f"the TP{inst.spec.tp} instance on devices {list(inst.spec.devices)} "
                                   "is not running (start it first: destinations must be warm)")
    if any(src is dest for src, _ in sources):
        raise SwitchSetupError("the destination is also a source")
    if len({id(src) for src, _ in sources}) != len(sources):
        raise SwitchSetupError("a source instance is listed twice")
    devices = [d for src, _ in sources for d in src.spec.devices]
    if len(set(devices)) != len(devices):
        raise SwitchSetupError(f"source instances share devices: {devices}")
    want = _model_key(dest)
    for src, _ in sources:
        if _model_key(src) != want:
            raise SwitchSetupError(f"source TP{src.spec.tp} runs {_model_key(src)}, the destination {want}: "
                                   "KV moves only between instances of the same model")


def _is_closed(inst: TpInstance) -> bool:
    # An instance closes itself when a rank fails.
    return inst.closed


def _model_key(inst: TpInstance) -> tuple:
    g = inst.info.kv
    return (inst.spec.model, g.num_layers, g.num_kv_heads, g.head_dim, g.dtype, inst.info.vocab_size)


def _describe(e: BaseException) -> str:
    return str(e) if isinstance(e, _MigrationFailed) else f"{type(e).__name__}: {e}"


def _by_message(failures: list[tuple[int, str]]) -> list[str]:
    """One line per distinct error (an aborted handshake is the same on every participant)."""
    ids: dict[str, list[int]] = {}
    for pid, message in failures:
        ids.setdefault(message, []).append(pid)
    return [f"participant(s) {who}: {message}" for message, who in ids.items()]


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
