"""Rank 0's loop: commands from the controller in, one operation per command out.

Each command (tiertp.execution.commands, from TpInstance over a pipe) is
checked and planned by tiertp.execution.leader.Leader, broadcast to the
followers, applied here, and answered. Replies: ("ready", InstanceInfo)
once, then per command ("ok", value), ("rejected", CommandRejected) when it
was refused with nothing changed, or ("call_failed", {rank: message}) when a
`RankCall` raised on some rank. `Park` / `Unpark` reach the followers as
`RankCall`s (tiertp.execution.park_calls; after the leader's checks they
cannot fail: one that does ends the rank, as a failed forward would).
`SetPrefillChunk` changes only the leader's planning (no operation reaches
the followers). An exception anywhere else (a forward that raised: the
ranks may disagree from here on) ends the rank process, which first sends
("failed", message).
"""

from __future__ import annotations

import torch

from tiertp.execution import commands, ops
from tiertp.execution.apply import apply
from tiertp.execution.collectives import broadcast, gather
from tiertp.execution.errors import CommandRejected
from tiertp.execution.kv_view import geometry_of
from tiertp.execution.leader import Leader
from tiertp.execution.park_calls import ParkOnRank, UnparkOnRank
from tiertp.execution.rank_call import RankCall
from tiertp.execution.rank_handle import RankHandle
from tiertp.execution.records import InstanceInfo, InstanceStats, NewRequest, RequestId, RequestState
from tiertp.execution.spec import InstanceSpec


class LeaderLoop:
    """Rank 0's command loop over the controller's pipe."""

    def __init__(self, conn, handle: RankHandle, tokenizer, spec: InstanceSpec):
        self.conn, self.handle, self.ctx = conn, handle, handle.ctx
        runner = handle.model_runner
        cfg = runner.model_config
        eos = set(cfg.hf_eos_token_id or ())
        if getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.info = InstanceInfo(
            tp=spec.tp, vocab_size=int(cfg.vocab_size), context_len=int(cfg.context_len),
            kv_capacity_tokens=int(runner.max_total_num_tokens),
            max_running_requests=int(handle.kv.req_to_token_pool.size),
            eos_token_ids=tuple(sorted(eos)), kv=geometry_of(handle))
        self.leader = Leader(handle.kv, self.info.vocab_size, self.info.eos_token_ids, spec.prefill_chunk_tokens)

    def run(self) -> None:
        self.conn.send(("ready", self.info))
        with torch.no_grad():
            while True:
                try:
                    command = self.conn.recv()
                except EOFError:  # the controller is gone: stop the followers, nobody to answer
                    command = None
                if command is None or isinstance(command, commands.Shutdown):
                    if self.ctx.group is not None:
                        broadcast(self.ctx, ops.Shutdown())
                    if command is not None:
                        self.conn.send(("ok", None))
                    return
                try:
                    reply = self._execute(command)
                except CommandRejected as e:
                    reply = ("rejected", e)
                self.conn.send(reply)

    def _execute(self, command: commands.Command) -> tuple:
        """The reply to one command; CommandRejected when it was refused with nothing changed."""
        match command:
            case commands.Iterate():
                return ("ok", self._iterate(command.admit, command.release))
            case commands.Release():
                self._release(command.rids)
                return ("ok", None)
            case commands.Export():
                return ("ok", self.leader.export(command.rids))
            case commands.Park():
                return ("ok", self._park(command.rids))
            case commands.Unpark():
                self._run_everywhere(UnparkOnRank(self.leader.plan_unpark(command.rids)))
                return ("ok", None)
            case commands.ReserveSlots():
                return ("ok", self._run(self.leader.plan_reserve(command.counts)))
            case commands.FreeSlots():
                self._run(self.leader.plan_free(command.slots))
                return ("ok", None)
            case commands.Adopt():
                self._adopt(command.states)
                return ("ok", None)
            case commands.SetPrefillChunk():
                self.leader.set_chunk(command.tokens)
                return ("ok", None)
            case commands.Stats():
                return ("ok", self._stats())
            case commands.CallRanks():
                return self._call(command.call)
        raise TypeError(f"unknown command {command!r}")

    def _run(self, op: ops.Operation):
        """Broadcast `op`, apply it here; the leader's own result."""
        if self.ctx.group is not None:
            broadcast(self.ctx, op)
        return apply(self.handle, op)

    def _iterate(self, admit: list[NewRequest], release: list[RequestId]) -> list:
        plan = self.leader.plan_iteration(admit, release)
        decode_logits, extended = self._run(plan)
        # Requests that finished their extend joined the running batch after the decode, at its end.
        decoding = self.handle.kv.running[: len(plan.decode_tokens)]
        self.leader.book_admitted(plan, admit)
        out = []
        if decode_logits is not None:
            out += self.leader.sample(decoding, decode_logits)
        if extended is not None:
            logits, finished = extended
            out += self.leader.sample(finished, logits)
        return out

    def _release(self, rids: list[RequestId]) -> None:
        self._run(self.leader.plan_release(rids))
        self.leader.book_released(rids)

    def _adopt(self, states: list[RequestState]) -> None:
        self._run(self.leader.plan_adopt(states))
        self.leader.book_adopted(states)

    def _park(self, rids: list[RequestId]) -> list[RequestState]:
        """Export and park in one command (one round trip for a hand-off)."""
        states = self.leader.plan_park(rids)
        self._run_everywhere(ParkOnRank(tuple(rids)))
        return states

    def _run_everywhere(self, call: RankCall) -> None:
        """Run a checked state change on every rank; raising (the ranks may now disagree) ends the rank."""
        results = gather(self.ctx, self._run(ops.Call(call)))
        errors = [f"rank {r}: {res[1]}" for r, res in enumerate(results) if res[0] == "error"]
        if errors:
            raise RuntimeError(f"{call.describe()} failed after the leader's checks: {'; '.join(errors)}")

    def _call(self, call: RankCall) -> tuple:
        results = gather(self.ctx, self._run(ops.Call(call)))
        errors = {r: res[1] for r, res in enumerate(results) if res[0] == "error"}
        if errors:
            return ("call_failed", errors)
        return ("ok", [res[1] for res in results])

    def _stats(self) -> InstanceStats:
        kv = self.handle.kv
        free = kv.free_slots()
        return InstanceStats(running=len(kv.running), pending=len(kv.pending),
                             kv_used_slots=self.info.kv_capacity_tokens - free, kv_free_slots=free,
                             reserved_slots=kv.reserved_count())
