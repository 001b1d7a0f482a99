"""`SwitchCoordinator`: move requests, KV included, from TP instances to another one.

One mechanism for both ways requests move between instances:
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

A hand-off is overlapped with the source's next iterations (`hand_off`,
the default): instead of staying paused for the whole migration, the
source *parks* the requests (they leave its running batch, their KV slots
untouched) and resumes as soon as its own ranks finished their part of the
migration: the handshake when the destination pulls the KV out of the
source's pool (on CPU), the last chunk sent when it was staged. The
source's other requests decode and new ones prefill meanwhile (into other
slots: a parked request's slots are neither freed nor written) while the
destination copies, adopts and resumes; only then does the source release
the requests. If the hand-off fails, the source unparks them: they
continue there with exactly the tokens they would have had.

Rollback: until the destination adopted the requests, a failure anywhere
(MigrationAborted: the destination is out of KV space, a rank error, a rank
that died) undoes the switch: destination ranks free the slots they had
allocated, every instance returns to its pause state of before, and
SwitchRolledBack is raised. The sources were only read, so their requests
continue exactly as if nothing had happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tiertp.execution.rank_call import RankCall
from tiertp.execution.records import RequestId
from tiertp.kv.executor import DEFAULT_CHUNK_BYTES
from tiertp.switching import rank_migrate
from tiertp.switching.control_store import ControlStore
from tiertp.switching.errors import SwitchRolledBack, SwitchSetupError
from tiertp.switching.layout_ids import new_id, old_id
from tiertp.switching.participant import RelayParticipant, Source, SwitchParticipant
from tiertp.switching.planning import SwitchPlan, plan_switch
from tiertp.switching.relay import plannable, relay
from tiertp.switching.result import SwitchResult

# Small migrations use smaller staging chunks: two of them still pipeline,
# and the shared-memory segments stay small (they are created per switch).
_MIN_CHUNK_BYTES = 64 << 10


class SwitchCoordinator:
    """Runs switches and hand-offs between TP instances (SwitchParticipant:
    TpInstances this process controls, or proxies of them).

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

    def warm(self, *instances: SwitchParticipant) -> None:
        """Prepare started instances for switches (imports, store connection,
        KV pool moved into shared memory in every rank), so the first switch
        costs what the others do. Optional."""
        for inst in instances:
            inst.call_on_ranks(rank_migrate.Warm(self.store.address))

    # --- the two uses ---------------------------------------------------
    def switch(self, sources: Sequence[Source], dest: SwitchParticipant) -> SwitchResult:
        """Move the listed requests (all of each source's) to `dest`; the
        sources stay paused afterwards, `dest` runs."""
        return self._transfer(list(sources), dest, keep_sources_paused=True)

    def hand_off(self, source: SwitchParticipant, rids: Sequence[RequestId], dest: SwitchParticipant,
                 overlap: bool = True,
                 on_source_resumed: Callable[[], None] | None = None) -> SwitchResult:
        """Move `rids` from `source` to `dest`; both run afterwards.

        `overlap` (the default): the source iterates its other requests while
        the KV moves (the requests are parked there, then released; see the
        module doc). A source the caller had paused stays paused throughout.
        The moved requests are those the source parked: a RemoteInstance
        skips ones that finished meanwhile (SwitchResult.moved says which).
        `on_source_resumed` runs in this thread once the source may iterate
        again, before waiting for the destination (a caller driving the
        source from this same thread iterates it there; it must not touch
        `dest` nor the parked requests; raising rolls the hand-off back).
        `overlap=False`: the source is paused until it released them."""
        if not overlap:
            if on_source_resumed is not None:
                raise SwitchSetupError("on_source_resumed needs an overlapped hand-off")
            return self._transfer([(source, rids)], dest, keep_sources_paused=False)
        return self._hand_off_overlapped(source, list(rids), dest, on_source_resumed)

    # --- the mechanism --------------------------------------------------
    def _transfer(self, sources: list[Source], dest: SwitchParticipant, keep_sources_paused: bool) -> SwitchResult:
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
                sp = plan_switch(dest.info.kv.shape, [src.spec.devices for src, _ in sources], dest.spec.devices,
                                 exported)
                clock.mark("plan")
                by_name, moved_bytes, rank_ms = (self._migrate(sp, sources, dest) if sp.plan.moves
                                                 else ({}, (0, 0, 0), 0.0))
                pages = {sp.names[name]: slots for name, slots in by_name.items()}
                path = "kv-migrate"
            else:  # e.g. TP3: tiertp.kv plans power-of-two levels only
                pages, relayed = relay([(_relayable(src), states) for (src, _), states in zip(sources, exported)],
                                       _relayable(dest))
                moved_bytes, rank_ms, path = (relayed, 0, 0), 0.0, "relay"
            clock.mark("migrate")
            _adopt(dest, [s for batch in exported for s in batch], pages)
            clock.mark("adopt")
        except BaseException as e:
            lost = self._restore(sources, instances, was_paused)
            raise SwitchRolledBack(_describe(e), lost) from e
        # Committed: the destination holds the requests from here on and may
        # run at once; the sources free their copies after (still paused).
        dest.resume()
        stop_ms = clock.total()
        source_stop_ms = None
        try:
            for src, rids in sources:
                if rids:
                    src.release(list(rids))
            clock.mark("release_after_resume")
        finally:
            for inst, paused in zip(instances[:-1], was_paused):
                if not (keep_sources_paused or paused) and not _is_closed(inst):
                    inst.resume()
            if not keep_sources_paused:
                source_stop_ms = clock.total()
        return _result(exported, moved_bytes, stop_ms, {**clock.parts, "migrate_rank_max": rank_ms}, path,
                       source_stop_ms)

    def _hand_off_overlapped(self, source: SwitchParticipant, rids: list[RequestId], dest: SwitchParticipant,
                             on_source_resumed: Callable[[], None] | None) -> SwitchResult:
        _check([(source, rids)], dest)
        was_paused = [source.paused, dest.paused]
        clock = _Clock()
        source_stop: list[float] = []  # ms from pausing to resuming the source, once it resumed

        def resume_source() -> None:
            # The source's part of the migration is over: it may iterate again
            # (its parked requests' slots stay as they are until released).
            if source_stop:
                return
            source_stop.append(clock.total())
            if not was_paused[0] and not _is_closed(source):
                source.resume()
            if on_source_resumed is not None:
                on_source_resumed()

        source.pause()
        dest.pause()
        parked: list[RequestId] = []
        try:
            exported = source.park(rids)  # export + park: one round trip
            parked = [s.rid for s in exported]
            clock.mark("export")
            moving = [(source, parked)]
            if plannable(source.spec.tp) and plannable(dest.spec.tp):
                sp = plan_switch(dest.info.kv.shape, [source.spec.devices], dest.spec.devices, [exported])
                clock.mark("plan")
                by_name, moved_bytes, rank_ms = (self._migrate(sp, moving, dest, on_sources_done=resume_source)
                                                 if sp.plan.moves else ({}, (0, 0, 0), 0.0))
                pages = {sp.names[name]: slots for name, slots in by_name.items()}
                path = "kv-migrate"
            else:  # the relay reads the source itself: it resumes once the relay is done
                pages, relayed = relay([(_relayable(source), exported)], _relayable(dest))
                moved_bytes, rank_ms, path = (relayed, 0, 0), 0.0, "relay"
            resume_source()  # nothing to migrate, or the relay
            clock.mark("migrate")
            _adopt(dest, exported, pages)
            clock.mark("adopt")
        except BaseException as e:
            cause = _describe(e)
            if parked and not _is_closed(source):
                try:  # they continue on the source, exactly as they would have
                    source.unpark(parked)
                except Exception as ue:  # noqa: BLE001 - reported with the failure that caused it
                    cause += f"; unparking the requests on the source failed too: {_describe(ue)}"
            lost = self._restore([(source, rids)], [source, dest], was_paused)
            raise SwitchRolledBack(cause, lost) from e
        dest.resume()
        stop_ms = clock.total()
        if parked:
            source.release(parked)
        clock.mark("release_after_resume")
        parts = {**clock.parts, "migrate_rank_max": rank_ms, "source_stop": source_stop[0]}
        return _result([exported], moved_bytes, stop_ms, parts, path, source_stop[0])

    def _rank_call(self, call: rank_migrate.MigrationCall) -> RankCall:
        """The call running one instance's part of a migration on its ranks.
        A seam for tests (e.g. to hold a destination's copy back)."""
        return call

    def _migrate(self, sp: SwitchPlan, sources: list[Source], dest: SwitchParticipant,
                 on_sources_done: Callable[[], None] | None = None):
        """tiertp.kv.migrate on every rank at once. Returns (plan request id ->
        destination slots, (bytes between processes, bytes local, bytes the
        destination pulled), slowest rank's ms). `on_sources_done` runs once
        every source's call is back (their ranks are done with the migration;
        the destination may still be copying out of their pools; the sources
        then run again, so the destination does not copy on their cores).
        On failure the destination ranks' slots are freed and the error raised."""
        plan = sp.plan
        members = sum(src.spec.tp for src, _ in sources) + dest.spec.tp
        address, name = self.store.address, self.store.new_name()
        chunk = self.chunk_bytes or _chunk_bytes(plan)
        calls, first = [], 0
        for inst, role, to_id in [(src, "old", old_id) for src, _ in sources] + [(dest, "new", new_id)]:
            ids = tuple(to_id(d) for d in inst.spec.devices)
            calls.append((inst, rank_migrate.MigrationCall(plan, ids, role, first, members, address, name,
                                                           self.timeout_s, chunk,
                                                           sources_idle=on_sources_done is None)))
            first += inst.spec.tp
        # The destination first: its ranks do the copying (they pull from the
        # sources' pools) and its call has the longest way to its ranks.
        calls.insert(0, calls.pop())
        started, errors = [], []
        for inst, call in calls:
            try:
                started.append((inst, inst.begin_call(self._rank_call(call), timeout_s=3 * self.timeout_s)))
            except Exception as e:  # this instance is gone; its peers time out and report it too
                errors.append(f"TP{inst.spec.tp} instance on devices {list(inst.spec.devices)}: {_describe(e)}")
        results = {}

        def collect(inst, pending) -> None:
            try:
                results[id(inst)] = pending.result()
            except Exception as e:
                errors.append(f"TP{inst.spec.tp} instance on devices {list(inst.spec.devices)}: {_describe(e)}")

        # The sources' answers first: a source rank returns right after the
        # handshake when the destination pulls its pairs (it is not needed
        # for the copy), after its last chunk when they are staged. Either
        # way its ranks are done with this migration once it answered.
        for inst, pending in started:
            if inst is not dest:
                collect(inst, pending)
        if on_sources_done is not None:
            try:
                on_sources_done()
            except Exception as e:  # the destination's answer must still be read below
                errors.append(f"once the sources were done: {_describe(e)}")
        for inst, pending in started:
            if inst is dest:
                collect(inst, pending)
        per_rank = results.get(id(dest))
        errors += _by_message([(r["id"], r["error"]) for rs in results.values() for r in rs if "error" in r])
        if not errors and any(r["pages_digest"] != per_rank[0]["pages_digest"] for r in per_rank):
            errors.append("the destination's ranks allocated different slots (they must agree)")
        if errors:
            if per_rank is not None and not _is_closed(dest):
                try:
                    dest.call_on_ranks(rank_migrate.FreeReserved(name))
                except Exception as e:  # noqa: BLE001 - reported with the failure that caused it
                    errors.append(f"freeing the destination's slots failed too: {_describe(e)}")
            raise _MigrationFailed("; ".join(_dedupe(errors)))
        between = sum(r["bytes_sent"] for src, _ in sources for r in results[id(src)])
        local = sum(r["bytes_local"] for rs in results.values() for r in rs)
        pulled = sum(r["bytes_pulled"] for r in per_rank)
        rank_ms = max(r["ms"] for rs in results.values() for r in rs)
        return per_rank[0]["pages"], (between, local, pulled), rank_ms

    @staticmethod
    def _restore(sources: list[Source], instances: list[SwitchParticipant],
                 was_paused: list[bool]) -> tuple[int, ...]:
        """Put every live instance back in its pause state; the indexes of sources that died."""
        for inst, paused in zip(instances, was_paused):
            if not paused and not _is_closed(inst):
                inst.resume()
        return tuple(i for i, (src, _) in enumerate(sources) if _is_closed(src))


def _adopt(dest: SwitchParticipant, exported: list, pages: dict) -> None:
    """`dest` adopts the exported requests (RequestStates), their KV now in
    `pages` (request id -> destination slots); on failure those slots are freed."""
    states = [s.with_slots(pages[s.rid]) if s.kv_len else s for s in exported]
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


def _result(exported: list[list], moved_bytes: tuple[int, int, int], stop_ms: float, parts_ms: dict, path: str,
            source_stop_ms: float | None) -> SwitchResult:
    moved = [s for batch in exported for s in batch if s.kv_len]
    return SwitchResult(moved=tuple(s.rid for s in moved),
                        metadata_only=tuple(s.rid for batch in exported for s in batch if not s.kv_len),
                        kv_tokens=sum(s.kv_len for s in moved), bytes_between=moved_bytes[0],
                        bytes_local=moved_bytes[1], bytes_pulled=moved_bytes[2], stop_ms=stop_ms,
                        parts_ms=parts_ms, path=path, source_stop_ms=source_stop_ms)


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


def _check(sources: list[Source], dest: SwitchParticipant) -> None:
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


def _relayable(inst: SwitchParticipant) -> RelayParticipant:
    """`inst`, which the relay path reads or writes through this process."""
    if not isinstance(inst, RelayParticipant):
        raise SwitchSetupError(f"the TP{inst.spec.tp} instance on devices {list(inst.spec.devices)} "
                               f"({type(inst).__name__}) cannot relay KV through this process")
    return inst


def _is_closed(inst: SwitchParticipant) -> bool:
    # An instance closes itself when a rank fails.
    return inst.closed


def _model_key(inst: SwitchParticipant) -> tuple:
    return (inst.spec.model, inst.info.kv.shape, inst.info.vocab_size)


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
